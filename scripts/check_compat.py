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

`train` runs the README commands: train_reader.py on the shipped sample (30 updates, fp32), then its predict mode
on the sample's dev file (nbest.json: the best span of every question), and train_dpr.py --export_dpr on a
config-built 2-layer BERT with the packaged MiniLM's tokenizer (10 updates). Each step writes
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
"""

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "data", "sample")
ATOL = 1e-5


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
    run([env_python, "train_dpr.py", "--query_model_name_or_path", bert, "--passage_model_name_or_path", bert,
         "--export_dpr", "--max_train_steps", "10", "--output_dir", f"{out}/dpr", "--overwrite_output_dir"],
        f"{out}/train_dpr.log")

    reference = measure(out)
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


def load_reference(out):
    with open(os.path.join(out, "train.json")) as f:
        return json.load(f)["reference"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["train", "transformers4", "haystack"])
    parser.add_argument("--out", default="/tmp/compat")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    report = {"train": train, "transformers4": transformers4, "haystack": haystack}[args.step](out)
    with open(os.path.join(out, f"{args.step}.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps({"versions": report["versions"], "checks": report["checks"]}, indent=1))
    failed = [name for name, c in report["checks"].items() if not c["ok"]]
    print(f"{args.step}: {len(report['checks']) - len(failed)} checks passed, {len(failed)} failed"
          + (f": {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
