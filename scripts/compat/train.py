"""The `train` step of scripts/check_compat.py, in the project's environment: train the reader and the retrievers
with the README's commands, and record what they compute (logits, embeddings, the Retriever API's rankings and the
Reader API's answers) for the other three steps to compare with."""

import json
import os
import sys
from dataclasses import replace

from compat.common import (ATOL, RETRIEVERS, ROOT, SAMPLE, SNIPPET_RETRIEVERS, max_diff, measure, retrieval_questions,
                           run, versions)

# The project's modules at the top: this module runs only in the project's environment (check_compat.py imports a
# step's module only to run that step). Third-party packages stay inside the functions, as in every step.
sys.path.insert(0, ROOT)
from utils.files.corpus import load_passages  # noqa: E402
from utils.reader import Reader  # noqa: E402
from utils.retriever import Retriever  # noqa: E402
from utils.retriever.sentence_windows import sentence_windows  # noqa: E402
from utils.runtime.flags import packaged_minilm  # noqa: E402


def project_retrieval(out):
    """With the project's environment: what the Retriever API ranks for every DPR dev question over the sample's
    corpus (top 5 passages), the texts it embeds (passages, or their sentence windows) and their embeddings,
    and the question embeddings: what the haystack3 step compares Haystack's pipeline with."""
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
