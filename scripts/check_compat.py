"""One-off check: models trained with the pinned stack (transformers 5) load and compute the same in the tools
users run on transformers 4.x. Not part of the test suite: it needs three environments.

    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
    # 1. the project's environment (requirements.txt): train, and record what 5.x computes
    .venv/bin/python scripts/check_compat.py train --out /tmp/compat
    # 2. transformers 4.57.6 + sentence-transformers 5.7.0 (python3 -m venv V4; V4/bin/pip install torch==2.13.0
    #    transformers==4.57.6 tokenizers==0.22.2 "huggingface_hub<1.0" sentence-transformers==5.7.0)
    V4/bin/python scripts/check_compat.py transformers4 --out /tmp/compat
    # 3. Haystack 1.x (python3 -m venv VH; VH/bin/pip install torch==2.13.0; then VH/bin/pip install
    #    -c <(echo torch==2.13.0) "farm-haystack[inference]==1.26.4.post0" transformers==4.51.3). Haystack allows
    #    transformers <5 but works only up to 4.51.3 (4.52: DPR query tokenisation gets truncation_strategy
    #    twice; 4.53+: `SequenceSummary` is gone from transformers.modeling_utils and Haystack fails to import).
    HAYSTACK_TELEMETRY_ENABLED=False VH/bin/python scripts/check_compat.py haystack --out /tmp/compat
    # 4. Haystack 3.x, on the pinned stack: docs/COMPATIBILITY.md's install line (python3 -m venv VH3;
    #    VH3/bin/pip install -c requirements.txt torch transformers "haystack-ai==3.4.*" transformers-haystack==2.0.0
    #    sentence-transformers-haystack==2.0.0)
    HAYSTACK_TELEMETRY_ENABLED=False VH3/bin/python scripts/check_compat.py haystack3 --out /tmp/compat

`train` runs the README commands: train_reader.py on the shipped sample (30 updates, fp32), then its predict mode
on the sample's dev file (nbest.json: the best span of every question), and train_dpr.py --export_dpr on a
config-built 2-layer BERT with the packaged MiniLM's tokenizer (10 updates), the same on sentences
(--window_sentences 1), and train_dpr.py from the packaged MiniLM on passages, on sentences and on passages
without their titles (--embed_title false; 10 updates each, for rankings whose scores are spread like a real
retriever's). Each step writes
OUT/<step>.json (versions, checks, numbers) and exits non-zero if a check fails. Only the standard library is
imported at the top: each step imports what its environment has. The steps are in compat/ (common.py: what they
share; train.py, transformers4.py, haystack1.py, haystack3.py with haystack3_snippet.py and token_types.py); a
step's module is imported only to run that step, so compat/train.py, which runs only in the project's
environment, imports the project's modules at its top.

What is compared (embeddings and logits with atol 1e-5):
* transformers4: the reader directory in pipeline("question-answering") answers every dev question with the
  span train_reader.py decodes as best (no null answer, no word alignment: the decoding train_reader.py does);
  its logits in AutoModelForQuestionAnswering equal 5.x's; dpr_question_encoder/ and dpr_context_encoder/ in
  DPRQuestionEncoder/DPRContextEncoder and query_encoder/, passage_encoder/ in SentenceTransformer(dir) give
  5.x's embeddings; tokenizers give the same ids.
* haystack: FARMReader(reader dir).predict answers every dev question with the span train_reader.py decodes as
  best when answers may be of any length (FARMReader caps them at 1000 tokens, train_reader.py at 30);
  DensePassageRetriever(dpr dirs).embed_queries / embed_documents equal what the DPR classes compute under
  5.x for the inputs Haystack builds (it strips a question's final "?", and gives a passage's title and text
  one segment: token_type_ids all 0, where train_dpr.py trains with 0 for the title and 1 for the text).
* haystack3: TransformersExtractiveReader(reader dir) against train_reader.py's best span (it feeds the model no
  token_type_ids and never reads the null logit: the differences are explained by a diagnostic run that feeds
  them); each retriever's query_encoder/ and passage_encoder/ in SentenceTransformersTextEmbedder /
  SentenceTransformersDocumentEmbedder with InMemoryDocumentStore + InMemoryEmbeddingRetriever, ranking the
  sample's corpus for every DPR dev question, against the top 5 of the project's Retriever API; for the
  sentence-trained retrievers the documents are split into the project's sentence windows (DocumentSplitter with
  the project's split as its function) and a passage ranks by its best window. `train` records those rankings.
  And the Haystack 3.x snippet of docs/COMPATIBILITY.md, run as it stands (only its three paths changed) on the
  reader and each MiniLM retriever: its top 5 passages against the Retriever API's (trained without titles) or
  the same setting's ranking above (with titles), its answers against the Reader API's best span of any length
  over the same top 5 passages (recorded by `train`), equal once the reader is fed the token_type_ids.
"""

import argparse
import importlib
import json
import os
import sys

# step -> (its module, its function), the module imported only to run it: compat/train.py imports the project's
# modules, which the other environments lack. This file's folder (scripts/) is sys.path[0]: `compat` is found there.
STEPS = {"train": ("compat.train", "train"), "transformers4": ("compat.transformers4", "transformers4"),
         "haystack": ("compat.haystack1", "haystack"), "haystack3": ("compat.haystack3", "haystack3")}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=list(STEPS))
    parser.add_argument("--out", default="/tmp/compat")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    module, function = STEPS[args.step]
    report = getattr(importlib.import_module(module), function)(out)
    with open(os.path.join(out, f"{args.step}.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps({"versions": report["versions"], "checks": report["checks"]}, indent=1))
    failed = [name for name, c in report["checks"].items() if not c["ok"]]
    print(f"{args.step}: {len(report['checks']) - len(failed)} checks passed, {len(failed)} failed"
          + (f": {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
