"""What every step of scripts/check_compat.py shares: the paths, the tolerances, the sample's inputs, the report's
versions and agreements, and measure (what the exported directories compute, under 5.x in `train` and 4.x in
`transformers4`). Imported in all four environments: only the standard library at the top."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # scripts/compat/ -> the root
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


# The train step's retrievers: the tiny BERT and the packaged MiniLM, each on whole passages and on sentences.
# And the MiniLM one on passages without their titles (--embed_title false): what Haystack's default embeds.
RETRIEVERS = ("dpr", "dpr-sentences", "dpr-minilm", "dpr-minilm-sentences", "dpr-minilm-text")
# Those the Haystack 3.x snippet (docs/COMPATIBILITY.md) is run on: the tiny BERT's rankings are near-ties.
SNIPPET_RETRIEVERS = ("dpr-minilm", "dpr-minilm-sentences", "dpr-minilm-text")


def retrieval_questions():
    """Every question of the sample's DPR dev file: what the retrieval rankings are compared on."""
    with open(os.path.join(SAMPLE, "dpr_dev.json")) as f:
        return [q["question"] for q in json.load(f)]


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


def agreement(differ, total):
    return {"questions": total, "agree": total - len(differ), "differ": differ}


def load_reference(out):
    with open(os.path.join(out, "train.json")) as f:
        return json.load(f)["reference"]
