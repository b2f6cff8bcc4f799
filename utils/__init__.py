"""What the top-level scripts stand on, in layers that each import only from below: errors.py, numeric.py and
sentences.py (base) -> files/ (files in and checked) -> loop/ (the shared training loop) -> search/ (vectors and
texts in, rankings out) -> reader/, retriever/ (the two models, their training tasks and trained APIs) -> system/
(the QA system and its server). Flags are read by the scripts; everything here takes typed configs."""
