"""The `transformers4` step of scripts/check_compat.py: the exported directories in transformers 4.x and
sentence-transformers, against the numbers `train` recorded under 5.x."""

import os

from compat.common import ATOL, dev_questions, load_reference, max_diff, measure, versions

# Imports inside the function: this environment has transformers 4.x and sentence-transformers, not the project's
# dependencies.


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
