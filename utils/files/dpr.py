"""DPR training data (facebookresearch/DPR and Haystack 1.x layout): a JSON list of {"question", "answers",
"positive_ctxs", "negative_ctxs", "hard_negative_ctxs"}, each ctx {"title", "text", "passage_id"} (checked as a
corpus's passages are, utils.files.corpus). Validation names the file and the question (its "id", else its index)
in a one-line UserError.
"""

import numpy as np

from utils.errors import UserError
from utils.files.corpus import check_ctx, passage_key, unique_passages
from utils.files.jsonfiles import read_json


def load_dpr(path: str) -> list[dict]:
    rows = read_json(path)
    if isinstance(rows, dict) and "data" in rows:
        rows = rows["data"]
    if not isinstance(rows, list):
        raise UserError(f"{path}: expected a JSON list of DPR questions")
    if not rows:
        raise UserError(f"{path}: the dataset is empty")
    if isinstance(rows[0], dict) and ("paragraphs" in rows[0] or "context" in rows[0]):
        raise UserError(f"{path}: this is SQuAD-format data, not DPR; convert it with "
                        "`python make_dpr_data.py FILE --out dpr.json --passages passages.jsonl`")
    out = []
    for i, row in enumerate(rows):
        where = f"question {row.get('id', f'#{i}') if isinstance(row, dict) else f'#{i}'}"
        if not isinstance(row, dict) or not isinstance(row.get("question"), str) or not row["question"].strip():
            raise UserError(f"{path}: {where}: missing or empty 'question'")
        positives = row.get("positive_ctxs")
        if not isinstance(positives, list) or not positives:
            raise UserError(f"{path}: {where}: needs at least one entry in 'positive_ctxs'")
        lists = {}
        for key in ("positive_ctxs", "hard_negative_ctxs", "negative_ctxs"):
            value = row.get(key) or []
            if not isinstance(value, list):
                raise UserError(f"{path}: {where}: '{key}' should be a list")
            lists[key] = [check_ctx(c, path, where) for c in value]
        out.append({"id": str(row.get("id", i)), "question": row["question"], "answers": row.get("answers", []),
                    **lists})
    return out


def training_passages(questions: list[dict], num_hard_negatives: int, seed: int) -> list[list[dict]]:
    """For each question: its first positive, then `num_hard_negatives` negatives: the top hard negatives,
    topped up from `negative_ctxs`, then (if still short) from other questions' positives. Fixed per question
    (a pure function of the data and seed), so every batch has the same shape on every process and a resumed
    run sees the same passages."""
    rng = np.random.default_rng(seed)
    pool = [q["positive_ctxs"][0] for q in questions]
    out = []
    for q in questions:
        gold = {passage_key(c) for c in q["positive_ctxs"]}
        negatives = [c for c in q["hard_negative_ctxs"] + q["negative_ctxs"] if passage_key(c) not in gold]
        negatives = negatives[:num_hard_negatives]
        tries = 0
        while len(negatives) < num_hard_negatives and tries < 100:
            tries += 1
            c = pool[int(rng.integers(len(pool)))]
            if passage_key(c) not in gold and c not in negatives:
                negatives.append(c)
        if len(negatives) < num_hard_negatives:
            raise UserError(f"question {q['id']}: cannot find {num_hard_negatives} negatives; "
                            "lower --num_hard_negatives")
        out.append([q["positive_ctxs"][0]] + negatives)
    return out


def evaluation_corpus(dev: list[dict], passages: list[dict] | None) -> tuple[list[dict], int]:
    """The passages to rank: the --passages corpus plus any gold passage missing from it (counted), or,
    without a corpus, every distinct context in the dev file."""
    corpus, added = unique_passages(passages or []), 0
    seen = {passage_key(c) for c in corpus}
    for q in dev:
        for c in q["positive_ctxs"] + ([] if passages else q["hard_negative_ctxs"] + q["negative_ctxs"]):
            if passage_key(c) not in seen:
                seen.add(passage_key(c))
                corpus.append(c)
                added += passages is not None
    return corpus, added
