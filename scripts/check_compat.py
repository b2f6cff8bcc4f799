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
imported at the top: each step imports what its environment has.

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
import functools
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "data", "sample")
ATOL = 1e-5
SCORE_TOL = 1e-4  # retrieval scores (dot products near 60 here) in float32 (Retriever) vs float64 (Haystack)


def versions(*names):
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def dev_questions():
    """(id, question, context) of every question of the sample's dev file."""
    with open(os.path.join(SAMPLE, "dev.json")) as f:
        return [(q["id"], q["question"], p["context"]) for a in json.load(f)["data"] for p in a["paragraphs"]
                for q in p["qas"]]


def dpr_inputs():
    """A few dev questions and corpus passages: what the DPR embeddings are compared on."""
    with open(os.path.join(SAMPLE, "dpr_dev.json")) as f:
        questions = [q["question"] for q in json.load(f)[:6]]
    with open(os.path.join(SAMPLE, "dpr_passages.jsonl")) as f:
        passages = [json.loads(line) for line in f][:6]
    return questions, [(p["title"], p["text"]) for p in passages]


def run(cmd, log):
    print("+", " ".join(cmd), flush=True)
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode:
        sys.exit(f"{cmd[1]} exited {proc.returncode}; see {log}")


def measure(out):
    """What the exported directories compute through the libraries' own public loaders, in this environment."""
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer, DPRContextEncoder, DPRQuestionEncoder

    result = {}
    reader_dir = os.path.join(out, "reader")
    tok = AutoTokenizer.from_pretrained(reader_dir)
    model = AutoModelForQuestionAnswering.from_pretrained(reader_dir).eval()
    reader = {}
    with torch.no_grad():
        for qid, question, context in dev_questions():
            enc = tok(question, context, truncation="only_second", max_length=384, return_tensors="pt")
            logits = model(**enc)
            reader[qid] = {"input_ids": enc["input_ids"][0].tolist(), "start": logits.start_logits[0].tolist(),
                           "end": logits.end_logits[0].tolist()}
    result["reader"] = reader

    dpr = os.path.join(out, "dpr")
    questions, passages = dpr_inputs()
    titles, texts = [t for t, _ in passages], [x for _, x in passages]
    q_tok = AutoTokenizer.from_pretrained(f"{dpr}/dpr_question_encoder")
    p_tok = AutoTokenizer.from_pretrained(f"{dpr}/dpr_context_encoder")
    q_in = dict(q_tok(questions, padding=True, truncation=True, max_length=64, return_tensors="pt"))
    p_in = dict(p_tok(titles, texts, padding=True, truncation="only_second", max_length=256, return_tensors="pt"))
    # The inputs Haystack 1.x builds (see the module docstring).
    hq_in = dict(q_tok([q[:-1] if q.endswith("?") else q for q in questions], padding="max_length", truncation=True,
                       max_length=64, return_tensors="pt"))
    hp_in = dict(p_tok(list(zip(titles, texts)), padding="max_length", truncation=True, max_length=256,
                       return_tensors="pt"))
    hp_in["token_type_ids"] = torch.zeros_like(hp_in["token_type_ids"])
    q_enc = DPRQuestionEncoder.from_pretrained(f"{dpr}/dpr_question_encoder").eval()
    p_enc = DPRContextEncoder.from_pretrained(f"{dpr}/dpr_context_encoder").eval()
    with torch.no_grad():
        result["dpr"] = {
            "question_ids": q_in["input_ids"].tolist(), "passage_ids": p_in["input_ids"].tolist(),
            "dpr_question": q_enc(**q_in).pooler_output.tolist(),
            "dpr_context": p_enc(**p_in).pooler_output.tolist(),
            "haystack_question": q_enc(**hq_in).pooler_output.tolist(),
            "haystack_context": p_enc(**hp_in).pooler_output.tolist(),
            "st_query": SentenceTransformer(f"{dpr}/query_encoder", device="cpu").encode(
                questions, convert_to_numpy=True).tolist(),
            "st_passage": SentenceTransformer(f"{dpr}/passage_encoder", device="cpu").encode(
                [[t, x] for t, x in passages], convert_to_numpy=True).tolist(),
        }
    return result


def max_diff(a, b):
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    return float(np.abs(a - b).max())


# The train step's retrievers: the tiny BERT and the packaged MiniLM, each on whole passages and on sentences.
# And the MiniLM one on passages without their titles (--embed_title false): what Haystack's default embeds.
RETRIEVERS = ("dpr", "dpr-sentences", "dpr-minilm", "dpr-minilm-sentences", "dpr-minilm-text")
# Those the Haystack 3.x snippet (docs/COMPATIBILITY.md) is run on: the tiny BERT's rankings are near-ties.
SNIPPET_RETRIEVERS = ("dpr-minilm", "dpr-minilm-sentences", "dpr-minilm-text")


def retrieval_questions():
    """Every question of the sample's DPR dev file: what the retrieval rankings are compared on."""
    with open(os.path.join(SAMPLE, "dpr_dev.json")) as f:
        return [q["question"] for q in json.load(f)]


def project_retrieval(out):
    """With the project's environment: what the Retriever API ranks for every DPR dev question over the sample's
    corpus (top 5 passages), the texts it embeds (passages, or their sentence windows) and their embeddings,
    and the question embeddings: what the haystack3 step compares Haystack's pipeline with."""
    from utils.retriever import Retriever
    from utils.files.corpus import load_passages
    from utils.retriever.sentence_windows import sentence_windows

    passages_path = os.path.join(SAMPLE, "dpr_passages.jsonl")
    questions = retrieval_questions()
    result = {}
    for name in RETRIEVERS:
        retriever = Retriever(os.path.join(out, name), device="cpu")
        index = retriever.index(passages_path, bm25=False, progress=False)
        windows, _ = sentence_windows(load_passages(passages_path), retriever.settings.window_sentences)
        result[name] = {
            "settings": {k: getattr(retriever.settings, k) for k in ("pooling", "similarity", "embed_title",
                                                                    "window_sentences", "max_query_length",
                                                                    "max_passage_length", "precision")},
            "top5": [[[h["passage_id"], h["score"]] for h in hits] for hits in retriever.search(index, questions, k=5)],
            "question_embeddings": retriever.encode_questions(questions).tolist(),
            "texts": [{"title": w["title"], "text": w["text"], "passage_id": w["passage_id"]} for w in windows],
            "text_embeddings": [list(map(float, row)) for row in index.shards[0].embeddings],  # one shard in memory
        }
    return result


def project_answers(out, retrieval):
    """With the project's environment: for every DPR dev question and each retriever the Haystack 3.x snippet is run
    on, the Reader API's best span over that retriever's top 5 passages (any length, no null threshold: the rule of
    Haystack's reader with no_answer=False; among equal scores the first passage)."""
    from dataclasses import replace

    from utils.reader import Reader
    from utils.files.corpus import load_passages

    texts = {p["passage_id"]: p["text"] for p in load_passages(os.path.join(SAMPLE, "dpr_passages.jsonl"))}
    reader = Reader(os.path.join(out, "reader"), device="cpu")
    reader.settings = replace(reader.settings, max_answer_length=reader.settings.max_seq_length)
    result = {}
    for name in SNIPPET_RETRIEVERS:
        best = []
        for question, hits in zip(retrieval_questions(), retrieval[name]["top5"]):
            spans = [a["nbest"][0] for a in reader.answer([(question, texts[pid]) for pid, _ in hits]) if a["nbest"]]
            best.append(max(spans, key=lambda span: span["score"])["text"])
        result[name] = best
    return result


def train(out):
    """With the project's environment: train both models, record what they compute, and check in-stack
    consistency (the DPR classes and SentenceTransformer agree: both pool [CLS], no projection)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    sys.path.insert(0, ROOT)
    from utils.loop.args import packaged_minilm

    os.makedirs(out, exist_ok=True)
    env_python = sys.executable
    run([env_python, "train_reader.py", "--output_dir", f"{out}/reader", "--max_train_steps", "30",
         "--mixed_precision", "no", "--overwrite_output_dir"], f"{out}/train_reader.log")
    # The best span of every dev question (nbest.json), as train_reader.py decodes: answers of at most 30 tokens
    # (the run's setting), and of any length (FARMReader's rule: its answer-length cap is 1000 tokens).
    for name, extra in (("reader-predict", []), ("reader-predict-any-length", ["--max_answer_length", "384"])):
        run([env_python, "train_reader.py", "--model_name_or_path", f"{out}/reader", "--do_train", "false",
             "--predict_file", f"{SAMPLE}/dev.json", "--output_dir", f"{out}/{name}", *extra], f"{out}/{name}.log")

    # A plain BERT (2 layers, 64 wide: tests/conftest.py's _tiny_bert) saved with the MiniLM tokenizer.
    bert = f"{out}/tiny-bert"
    tokenizer = AutoTokenizer.from_pretrained(packaged_minilm())
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=128, max_position_embeddings=512)).save_pretrained(bert)
    tokenizer.save_pretrained(bert)
    # Learning rate 1e-3: from a random start, the default 2e-5 for 10 updates leaves most consecutive top-5 scores
    # within 1e-4 of each other, so that even identical embeddings would rank differently by float rounding. Even so
    # the tiny BERT ranks (nearly) the same passages for every question: ranking numbers mean something for the
    # MiniLM retrievers below; for these only the embeddings and the exact (diagnostic) ranking are checked.
    dpr_args = ["--query_model_name_or_path", bert, "--passage_model_name_or_path", bert, "--max_train_steps", "10",
                "--learning_rate", "1e-3", "--mixed_precision", "no", "--overwrite_output_dir"]
    run([env_python, "train_dpr.py", *dpr_args, "--export_dpr", "--output_dir", f"{out}/dpr"], f"{out}/train_dpr.log")
    # The same tiny BERT trained on sentences (--window_sentences 1): a passage ranks by its best sentence.
    run([env_python, "train_dpr.py", *dpr_args, "--window_sentences", "1", "--output_dir", f"{out}/dpr-sentences"],
        f"{out}/train_dpr_sentences.log")
    # Both again from the packaged MiniLM (train_dpr.py's default start: mean pooling, cosine), 10 updates: a
    # retriever whose scores are spread like a real one's (the tiny BERT's all lie within about 0.15 of each other).
    for name, extra in (("dpr-minilm", []), ("dpr-minilm-sentences", ["--window_sentences", "1"]),
                        ("dpr-minilm-text", ["--embed_title", "false"])):
        run([env_python, "train_dpr.py", "--max_train_steps", "10", "--mixed_precision", "no", "--overwrite_output_dir",
             *extra, "--output_dir", f"{out}/{name}"], f"{out}/train_{name.replace('-', '_')}.log")

    reference = measure(out)
    reference["retrieval"] = project_retrieval(out)
    reference["answers"] = project_answers(out, reference["retrieval"])
    for key, name in (("best_span", "reader-predict"), ("best_span_any_length", "reader-predict-any-length")):
        with open(f"{out}/{name}/nbest.json") as f:
            reference[key] = {qid: d["nbest"][0]["text"] for qid, d in json.load(f).items() if d["nbest"]}
    d = reference["dpr"]
    checks = {"sentence-transformers query_encoder = DPRQuestionEncoder": max_diff(d["st_query"], d["dpr_question"]),
              "sentence-transformers passage_encoder = DPRContextEncoder": max_diff(d["st_passage"], d["dpr_context"])}
    report = {"step": "train", "versions": versions("torch", "transformers", "tokenizers", "huggingface_hub",
                                                    "sentence-transformers", "accelerate"),
              "reference": reference, "checks": {k: {"max_abs_diff": v, "ok": v <= ATOL} for k, v in checks.items()}}
    return report


def transformers4(out):
    """transformers 4.x: the reader in the question-answering pipeline, the DPR exports in the DPR classes and
    sentence-transformers, all compared with the numbers recorded under 5.x."""
    from transformers import pipeline

    reference = load_reference(out)
    here = measure(out)
    checks = {}
    ids_equal = all(here["reader"][q]["input_ids"] == r["input_ids"] for q, r in reference["reader"].items())
    checks["reader tokenizer: same input ids"] = {"ok": ids_equal}
    worst = max(max_diff(here["reader"][q][k], r[k]) for q, r in reference["reader"].items() for k in ("start", "end"))
    checks["reader logits (AutoModelForQuestionAnswering) = 5.x"] = {"max_abs_diff": worst, "ok": worst <= ATOL}

    qa = pipeline("question-answering", model=os.path.join(out, "reader"), device="cpu")
    agree, differ = 0, {}
    for qid, question, context in dev_questions():
        got = qa(question=question, context=context, max_seq_len=384, doc_stride=128, max_question_len=64,
                 max_answer_len=30, handle_impossible_answer=False, align_to_words=False)
        if got["answer"] == reference["best_span"][qid]:
            agree += 1
        else:
            differ[qid] = {"pipeline": got["answer"], "train_reader.py": reference["best_span"][qid]}
    checks["question-answering pipeline answers = train_reader.py's best span"] = {
        "questions": len(reference["best_span"]), "agree": agree, "differ": differ, "ok": not differ}

    for key in ("question_ids", "passage_ids"):
        checks[f"DPR tokenizer {key} = 5.x"] = {"ok": here["dpr"][key] == reference["dpr"][key]}
    for key, what in (("dpr_question", "DPRQuestionEncoder"), ("dpr_context", "DPRContextEncoder"),
                      ("st_query", "SentenceTransformer(query_encoder)"),
                      ("st_passage", "SentenceTransformer(passage_encoder)")):
        diff = max_diff(here["dpr"][key], reference["dpr"][key])
        checks[f"{what} embeddings = 5.x"] = {"max_abs_diff": diff, "ok": diff <= ATOL}
    return {"step": "transformers4", "checks": checks,
            "versions": versions("torch", "transformers", "tokenizers", "huggingface_hub", "sentence-transformers")}


def haystack(out):
    """Haystack 1.x: FARMReader on the reader directory, DensePassageRetriever on the DPR exports."""
    import numpy as np
    from haystack import Document
    from haystack.document_stores import InMemoryDocumentStore
    from haystack.nodes import DensePassageRetriever, FARMReader

    reference = load_reference(out)
    checks = {}
    reader = FARMReader(model_name_or_path=os.path.join(out, "reader"), use_gpu=False, max_seq_len=384,
                        doc_stride=128, progress_bar=False)
    agree, differ = 0, {}
    questions = dev_questions()
    for qid, question, context in questions:
        prediction = reader.predict(query=question, documents=[Document(content=context)], top_k=1)
        answer = prediction["answers"][0].answer if prediction["answers"] else None
        if answer == reference["best_span_any_length"][qid]:
            agree += 1
        else:
            differ[qid] = {"FARMReader": answer, "train_reader.py": reference["best_span_any_length"][qid]}
    checks["FARMReader answers = train_reader.py's best span of any length"] = {
        "questions": len(questions), "agree": agree, "differ": differ, "ok": not differ}

    dpr = os.path.join(out, "dpr")
    retriever = DensePassageRetriever(document_store=InMemoryDocumentStore(), use_gpu=False, progress_bar=False,
                                      query_embedding_model=f"{dpr}/dpr_question_encoder",
                                      passage_embedding_model=f"{dpr}/dpr_context_encoder")
    questions, passages = dpr_inputs()
    q_emb = retriever.embed_queries(questions)
    p_emb = retriever.embed_documents([Document(content=text, meta={"name": title}) for title, text in passages])
    ref = reference["dpr"]
    for name, got, key in (("embed_queries", q_emb, "haystack_question"),
                           ("embed_documents", p_emb, "haystack_context")):
        diff = max_diff(got, ref[key])
        checks[f"DensePassageRetriever.{name} = 5.x DPR classes on Haystack's inputs"] = {
            "max_abs_diff": diff, "ok": diff <= ATOL}
    # Not a check (always ok): how far Haystack's passage input (one segment) moves the embeddings train_dpr.py
    # trained, and whether each question's top passage (dot product, among these few) stays the same.
    q, p_haystack, p_ours = np.asarray(q_emb), np.asarray(p_emb), np.asarray(ref["dpr_context"])
    same_top = int((np.argmax(q @ p_haystack.T, 1) == np.argmax(q @ p_ours.T, 1)).sum())
    checks["note: Haystack passage embeddings vs train_dpr.py's (title/text segments 0/1)"] = {
        "max_abs_diff": max_diff(p_haystack, p_ours), "questions": len(questions), "same top passage": same_top,
        "ok": True}
    return {"step": "haystack", "versions": versions("farm-haystack", "torch", "transformers", "tokenizers",
                                                     "huggingface_hub", "sentence-transformers"),
            "checks": checks}


def pair_token_types(input_ids, attention_mask, sep_token_id):
    """The token_type_ids a BERT tokenizer gives a pair (a, b) for the ids of "a [SEP] b": 1 after the first
    [SEP] (b and its closing [SEP]), 0 up to it and on padding."""
    is_sep = (input_ids == sep_token_id).long()
    return (((is_sep.cumsum(1) - is_sep) >= 1) & (attention_mask == 1)).long()


class WithTokenTypes:
    """A Haystack reader's model called with the token_type_ids train_reader.py feeds it (0 question, 1 context)."""

    def __init__(self, model, sep_token_id):
        self.model, self.sep_token_id = model, sep_token_id

    def __call__(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=pair_token_types(input_ids, attention_mask, self.sep_token_id))


def agreement(differ, total):
    return {"questions": total, "agree": total - len(differ), "differ": differ}


def haystack3_reader(out, reference):
    """TransformersExtractiveReader (transformers-haystack) on the reader directory, each dev question with its
    own paragraph as the one Document: its top answer against train_reader.py's best span."""
    from haystack import Document
    from haystack.utils import ComponentDevice
    from haystack_integrations.components.readers.transformers import TransformersExtractiveReader

    reader_dir = os.path.join(out, "reader")
    with open(os.path.join(reader_dir, "reader_settings.json")) as f:
        ours = json.load(f)
    # What carries over from reader_settings.json: the window length and stride. Not the answer-length cap (the
    # reader has none) nor the SQuAD v2 null threshold (it never reads the [CLS] null logit).
    windows = {"max_seq_length": ours["max_seq_length"], "stride": ours["doc_stride"]}
    cpu = ComponentDevice.from_str("cpu")
    questions = dev_questions()

    def top_answers(reader):
        got = {}
        for qid, question, context in questions:
            answers = reader.run(query=question, documents=[Document(content=context)])["answers"]
            got[qid] = answers[0].data if answers else None  # data None: Haystack's no-answer
        return got

    def compare(got, key):
        return {qid: {"Haystack": a, "train_reader.py": reference[key].get(qid)} for qid, a in got.items()
                if a != reference[key].get(qid)}

    results = {}
    defaults = TransformersExtractiveReader(model=reader_dir, device=cpu)
    results["defaults (no_answer=True, top_k=20)"] = top_answers(defaults)
    results["no_answer=True, top_k=1"] = top_answers(TransformersExtractiveReader(model=reader_dir, device=cpu,
                                                                                  top_k=1, **windows))
    plain = TransformersExtractiveReader(model=reader_dir, device=cpu, no_answer=False, top_k=1, **windows)
    results["no_answer=False"] = top_answers(plain)
    fixed = TransformersExtractiveReader(model=reader_dir, device=cpu, no_answer=False, top_k=1, **windows)
    fixed.warm_up()
    fixed.model = WithTokenTypes(fixed.model, fixed.tokenizer.sep_token_id)
    results["diagnostic: no_answer=False + token_type_ids"] = top_answers(fixed)

    tok = plain.tokenizer
    longer = sum(len(tok(q, c)["input_ids"]) > windows["max_seq_length"] for _, q, c in questions)
    checks = {}
    for name, got in results.items():
        # Against the best span of any length: the reader caps no answer length (train_reader.py caps at 30).
        entry = {**agreement(compare(got, "best_span_any_length"), len(questions)),
                 "agree with the 30-token best span": len(questions) - len(compare(got, "best_span")),
                 "no-answer on top": sum(a is None for a in got.values())}
        if name.startswith("diagnostic"):
            # The explanation of the differences above, checked: fed the token_type_ids, the reader answers
            # exactly as train_reader.py decodes.
            checks[f"TransformersExtractiveReader ({name}) = train_reader.py's best span of any length"] = {
                **entry, "ok": not entry["differ"]}
        else:
            checks[f"note: TransformersExtractiveReader ({name}) vs train_reader.py's best span of any length"] = {
                **entry, "ok": True}
    with open(os.path.join(out, "reader-predict", "predictions.json")) as f:
        no_answer = sum(a == "" for a in json.load(f).values())
    checks["note: reader settings"] = {"carried over": windows, "dev contexts longer than one window": longer,
                                       "train_reader.py answers '' (its null threshold)": no_answer,
                                       "not carried over": {"max_answer_length": ours["max_answer_length"],
                                                            "null_threshold": ours["null_threshold"]},
                                       "ok": True}
    return checks


def haystack3_retrieval(out, reference):
    """Each retriever's query_encoder/ and passage_encoder/ in SentenceTransformersTextEmbedder /
    SentenceTransformersDocumentEmbedder, InMemoryDocumentStore and InMemoryEmbeddingRetriever over the sample's
    corpus, against the top 5 passages the project's Retriever API ranks (recorded by the train step). Returns the
    checks and {label: the top 5 [passage_id, score] of every question} of each setting that is not a diagnostic.
    """
    from haystack import Document, Pipeline
    from haystack.components.preprocessors import DocumentSplitter
    from haystack.components.retrievers.in_memory import InMemoryEmbeddingRetriever
    from haystack.document_stores.in_memory import InMemoryDocumentStore
    from haystack.utils import ComponentDevice
    from haystack_integrations.components.embedders.sentence_transformers import (
        SentenceTransformersDocumentEmbedder, SentenceTransformersTextEmbedder)

    sys.path.insert(0, ROOT)
    from utils.sentences import window_texts  # the project's split (standard library only)

    cpu = ComponentDevice.from_str("cpu")
    recorded = reference["retrieval"]
    questions = retrieval_questions()
    with open(os.path.join(SAMPLE, "dpr_passages.jsonl")) as f:
        passages = [json.loads(line) for line in f]
    whole = [Document(content=p["text"], meta={"title": p["title"], "passage_id": p["passage_id"]}) for p in passages]
    checks, rankings = {}, {}

    for name in RETRIEVERS:
        ours, directory = recorded[name], os.path.join(out, name)
        settings, n = recorded[name]["settings"], recorded[name]["settings"]["window_sentences"]
        similarity = "cosine" if settings["similarity"] == "cosine" else "dot_product"

        def text_embedder():
            return SentenceTransformersTextEmbedder(model=f"{directory}/query_encoder", device=cpu,
                                                    progress_bar=False, local_files_only=True)

        gaps = sorted(a[1] - b[1] for hits in ours["top5"] for a, b in zip(hits, hits[1:]))
        checks[f"note: {name}: the project's top-5 score gaps"] = {
            "median": gaps[len(gaps) // 2], "smallest": gaps[0], "below SCORE_TOL": sum(g <= SCORE_TOL for g in gaps),
            "gaps": len(gaps), "ok": True}
        embedder = text_embedder()
        embedder.warm_up()
        diff = max_diff([embedder.run(text=q)["embedding"] for q in questions], ours["question_embeddings"])
        checks[f"{name}: SentenceTransformersTextEmbedder(query_encoder) = Retriever.encode_questions"] = {
            "max_abs_diff": diff, "ok": diff <= ATOL}

        # The units documents are cut into: with sentence windows, the project's windows given as Documents
        # (passage_id in meta), Haystack's DocumentSplitter with the project's splitting as its function and with
        # its own split on periods, and the unsplit passages (what a user who does not split gets).
        if n:
            project_windows = [Document(content=w["text"], meta={"title": w["title"], "passage_id": w["passage_id"],
                                                                 "window": k}) for k, w in enumerate(ours["texts"])]
            splitter = DocumentSplitter(split_by="function", splitting_function=lambda text, n=n: window_texts(text, n))
            split = splitter.run(whole)["documents"]
            same = [(d.content, d.meta["passage_id"]) for d in split] == [(w["text"], w["passage_id"])
                                                                          for w in ours["texts"]]
            checks[f"{name}: DocumentSplitter(split_by='function', the project's split) = the project's windows"] = {
                "windows": len(split), "project windows": len(ours["texts"]), "ok": same}
            units = {"project windows": project_windows,
                     "DocumentSplitter(split_by='function')": split,
                     "DocumentSplitter(split_by='period', split_length=1)":
                         DocumentSplitter(split_by="period", split_length=1).run(whole)["documents"],
                     "whole passages": whole}
        else:
            units = {"whole passages": whole}

        sep = embedder.embedding_backend.model.tokenizer.sep_token
        embeddings = {"text only (default)": {}}
        if settings["embed_title"]:  # the title too: Haystack has no pair, only a separator within one segment
            embeddings.update({
                "meta_fields_to_embed=['title'] (separator '\\n')": {"meta_fields_to_embed": ["title"]},
                f"meta_fields_to_embed=['title'], embedding_separator=' {sep} '": {
                    "meta_fields_to_embed": ["title"], "embedding_separator": f" {sep} "}})
        for unit, documents in units.items():
            aligned = [(d.content, d.meta["passage_id"]) for d in documents] == [(t["text"], t["passage_id"])
                                                                                 for t in ours["texts"]]
            for setting, kwargs in embeddings.items():
                pair_ids = sep in kwargs.get("embedding_separator", "")
                for diagnostic in ((False, True) if aligned and pair_ids else (False,)):
                    doc_embedder = SentenceTransformersDocumentEmbedder(
                        model=f"{directory}/passage_encoder", device=cpu, progress_bar=False, local_files_only=True,
                        **kwargs)
                    doc_embedder.warm_up()
                    st = doc_embedder.embedding_backend.model  # shared by the embedders of this model: restored
                    if diagnostic:  # the pair's segments (0 title, 1 text), as the project's passage side encodes
                        preprocess, sep_id = st.preprocess, st.tokenizer.sep_token_id

                        def with_token_types(*args, **kw):
                            features = preprocess(*args, **kw)
                            features["token_type_ids"] = pair_token_types(features["input_ids"],
                                                                          features["attention_mask"], sep_id)
                            return features

                        st.preprocess = with_token_types
                    try:
                        embedded = doc_embedder.run(documents)["documents"]
                    finally:
                        st.__dict__.pop("preprocess", None)
                    store = InMemoryDocumentStore(embedding_similarity_function=similarity, shared=False)
                    store.write_documents(embedded)
                    pipe = Pipeline()
                    pipe.add_component("embedder", text_embedder())
                    pipe.add_component("retriever", InMemoryEmbeddingRetriever(store, top_k=len(embedded)))
                    pipe.connect("embedder.embedding", "retriever.query_embedding")
                    top1 = top5 = same_set = 0
                    score_diff = 0.0  # position-wise, top-5 scores: near-tied passages may swap, scores stay
                    passage_score_diff = 0.0  # the project's top-5 passages: Haystack's score of each vs ours
                    ranking = []
                    for q, hits in zip(questions, ours["top5"]):
                        ranked = {}  # passages by their best unit (MaxP), as the project ranks sentence windows
                        for doc in pipe.run({"embedder": {"text": q}})["retriever"]["documents"]:
                            ranked.setdefault(doc.meta["passage_id"], doc.score)
                        got, want = list(ranked)[:5], [pid for pid, _ in hits]
                        ranking.append([[pid, ranked[pid]] for pid in got])
                        top1 += got[:1] == want[:1]
                        top5 += got == want
                        same_set += set(got) == set(want)
                        score_diff = max(score_diff, max_diff([ranked[pid] for pid in got], [s for _, s in hits]))
                        passage_score_diff = max(passage_score_diff, max(abs(ranked[pid] - s) for pid, s in hits))
                    entry = {"questions": len(questions), "identical top-5": top5 / len(questions),
                             "identical top-1": top1 / len(questions), "same top-5 set": same_set / len(questions),
                             "max |score - ours| of our top-5 passages": passage_score_diff}
                    if aligned:
                        entry["max_abs_diff vs the project's embeddings"] = max_diff(
                            [d.embedding for d in embedded], ours["text_embeddings"])
                    label = f"{name}: {unit}, {setting}"
                    if not diagnostic:
                        rankings[label] = ranking
                    if diagnostic:
                        # The explanation checked: with the pair's segments the Haystack pipeline embeds and ranks
                        # exactly as the project.
                        # Rankings are compared by their scores: passages whose scores differ by float32
                        # rounding (SCORE_TOL) may swap.
                        entry["max top-5 score difference (position-wise)"] = score_diff
                        checks[f"{label} + token_type_ids 0/1 (diagnostic) = the project's ranking"] = {
                            **entry, "ok": score_diff <= SCORE_TOL
                            and entry["max_abs_diff vs the project's embeddings"] <= ATOL}
                    elif aligned and not settings["embed_title"]:
                        # Text alone, one segment: Haystack's default embeds exactly what the project does.
                        entry["max top-5 score difference (position-wise)"] = score_diff
                        checks[f"{label} = the project's ranking"] = {
                            **entry, "ok": score_diff <= SCORE_TOL
                            and entry["max_abs_diff vs the project's embeddings"] <= ATOL}
                    else:
                        checks[f"note: {label} vs the project's ranking"] = {**entry, "ok": True}
    return checks, rankings


SNIPPET_PAGE = os.path.join("docs", "COMPATIBILITY.md")  # the Haystack 3.x section's snippet
SNIPPET_MARKER = "<!-- scripts/check_compat.py haystack3 runs the next block"


def haystack3_snippet():
    """The Haystack 3.x snippet users copy: the ```python block after SNIPPET_MARKER in SNIPPET_PAGE."""
    with open(os.path.join(ROOT, SNIPPET_PAGE)) as f:
        page = f.read()
    found = re.search(re.escape(SNIPPET_MARKER) + r".*?-->\s*```python\n(.*?)\n```", page, re.S)
    if not found:
        sys.exit(f"{SNIPPET_PAGE}: no ```python block after {SNIPPET_MARKER!r}")
    return found.group(1)


def run_snippet(reader_dir, retriever_dir, corpus):
    """Runs the Haystack 3.x snippet as it stands with its three paths replaced; returns its variables (ask...)."""
    code = haystack3_snippet()
    for path, value in (("outputs/reader", reader_dir), ("outputs/dpr", retriever_dir),
                        ("data/sample/dpr_passages.jsonl", corpus)):
        if code.count(f'"{path}"') != 1:
            sys.exit(f"{SNIPPET_PAGE} snippet: expected the path \"{path}\" once")
        code = code.replace(f'"{path}"', json.dumps(value))
    sys.path.insert(0, ROOT)  # its one import from the project (it says: the project's root on the path)
    namespace = {"__name__": "haystack3_snippet"}
    exec(compile(code, f"{SNIPPET_PAGE} (Haystack 3.x snippet)", "exec"), namespace)
    return namespace


def haystack3_snippet_checks(out, reference, rankings):
    """The Haystack 3.x snippet on the reader and each MiniLM retriever, its results checked against what the steps
    above compare: its top 5 passages (by best window) against the Retriever API's where Haystack embeds what the
    project does (trained without titles), else against the ranking measured above for the snippet's setting; its
    answers against the Reader API's best span over the project's top 5 (the same passages where the rankings agree): a
    note, as the reader sees no token_type_ids, and exactly once it is fed them (the diagnostic)."""
    recorded, questions = reference["retrieval"], retrieval_questions()

    def compare(ranking, want):  # rankings: [[passage_id, score] x 5] per question
        ids = lambda r: [[pid for pid, _ in hits] for hits in r]  # noqa: E731
        return {"questions": len(questions),
                "identical top-5": sum(a == b for a, b in zip(ids(ranking), ids(want))) / len(questions),
                "identical top-1": sum(a[:1] == b[:1] for a, b in zip(ids(ranking), ids(want))) / len(questions),
                "max top-5 score difference (position-wise)": max(
                    max_diff([s for _, s in a], [s for _, s in b]) for a, b in zip(ranking, want))}

    def answers_vs_reader_api(ask, want):
        return agreement({q: {"Haystack": a, "Reader API": w} for q, w in zip(questions, want)
                          if (a := ask(q)[0].data) != w}, len(questions))

    checks = {}
    for name in SNIPPET_RETRIEVERS:
        ours, label = recorded[name], f"{name}: COMPATIBILITY.md snippet"
        print(f"{label}:", flush=True)
        snippet = run_snippet(os.path.join(out, "reader"), os.path.join(out, name),
                              os.path.join(SAMPLE, "dpr_passages.jsonl"))
        ask = functools.cache(snippet["ask"])
        ranking = [[[d.meta["passage_id"], d.score] for d in ask(q)[1]] for q in questions]
        entry = compare(ranking, ours["top5"])
        if not ours["settings"]["embed_title"]:
            checks[f"{label}: top 5 passages = the project's ranking"] = {
                **entry, "ok": entry["max top-5 score difference (position-wise)"] <= SCORE_TOL}
        else:  # the setting measured above, with the saved tokenizer's separator: the same ranking
            unit = "DocumentSplitter(split_by='function')" if ours["settings"]["window_sentences"] else "whole passages"
            measured = f"{name}: {unit}, meta_fields_to_embed=['title'], embedding_separator=' {snippet['sep']} '"
            same = compare(ranking, rankings[measured])
            ok = same["identical top-5"] == 1 and same["max top-5 score difference (position-wise)"] <= ATOL
            checks[f"{label}: top 5 passages = {measured}"] = {**same, "ok": ok}
            checks[f"note: {label} vs the project's ranking"] = {**entry, "ok": True}

        want = reference["answers"][name]
        checks[f"note: {label}: answers vs the Reader API over the project's top 5"] = {
            **answers_vs_reader_api(ask, want), "ok": True}
        if not ours["settings"]["embed_title"]:  # the same passages: fed the segments, the same answers
            reader = snippet["query"].get_component("reader")
            reader.model = WithTokenTypes(reader.model, reader.tokenizer.sep_token_id)
            entry = answers_vs_reader_api(snippet["ask"], want)
            checks[f"{label}: answers + token_type_ids (diagnostic) = the Reader API over the project's top 5"] = {
                **entry, "ok": not entry["differ"]}
    return checks


def haystack3(out):
    """Haystack 3.x (haystack-ai) with the transformers-haystack and sentence-transformers-haystack integrations:
    the reader in TransformersExtractiveReader, both retrievers' sentence-transformers directories in the
    SentenceTransformers embedders with InMemoryDocumentStore and InMemoryEmbeddingRetriever."""
    reference = load_reference(out)
    retrieval_checks, rankings = haystack3_retrieval(out, reference)
    checks = {**haystack3_reader(out, reference), **retrieval_checks,
              **haystack3_snippet_checks(out, reference, rankings)}
    return {"step": "haystack3", "checks": checks,
            "versions": versions("haystack-ai", "transformers-haystack", "sentence-transformers-haystack", "torch",
                                 "transformers", "tokenizers", "huggingface_hub", "sentence-transformers")}


def load_reference(out):
    with open(os.path.join(out, "train.json")) as f:
        return json.load(f)["reference"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["train", "transformers4", "haystack", "haystack3"])
    parser.add_argument("--out", default="/tmp/compat")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    report = {"train": train, "transformers4": transformers4, "haystack": haystack,
              "haystack3": haystack3}[args.step](out)
    with open(os.path.join(out, f"{args.step}.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps({"versions": report["versions"], "checks": report["checks"]}, indent=1))
    failed = [name for name, c in report["checks"].items() if not c["ok"]]
    print(f"{args.step}: {len(report['checks']) - len(failed)} checks passed, {len(failed)} failed"
          + (f": {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
