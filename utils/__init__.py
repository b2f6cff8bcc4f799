"""What the top-level scripts stand on, in layers that each import only from below: errors.py, numeric.py and
sentences.py (base) -> runtime/ (flags, processes, output directories, the atomic writer, batches) -> files/ (files
in and checked), splitting.py (documents into passages), max_length.py -> loop/ (the shared training loop) ->
search/ (vectors and texts in, rankings out) -> index/ (the index of a corpus, on disk) -> reader/, retriever/ (the
two models, their training tasks and trained APIs), feedback/ (the users' labels: their store, checks and export)
-> system/ (the QA system and its server). Flags are read by the
scripts; everything here takes typed configs."""
