"""Build DPR training data from any SQuAD-format file.

    python make_dpr_data.py squad.json --output dpr.json --passages passages.jsonl

Every paragraph becomes a passage (passage_id "Title#paragraph_index"). Every answerable question becomes a DPR
example: its own paragraph as the positive, the top BM25 paragraphs (question as the query, ranked with the bm25s
library) that contain none of its answer strings as hard negatives, and random paragraphs without an answer string as
negatives (answers matched as in utils.files.answers: normalised, on token boundaries). Unanswerable questions have
no positive and are left out.
"""

import os
import random
import sys
from dataclasses import dataclass
from typing import ClassVar, Optional

from utils.errors import UserError, exit_on_user_error
from utils.files.answers import answer_patterns, holds_answer, normalized
from utils.files.jsonfiles import write_json_file, write_json_lines
from utils.files.squad import load_squad
from utils.runtime.flags import arg, parse_args
from utils.search.bm25 import BM25


def build(examples: list[dict], num_hard_negatives: int, num_negatives: int, seed: int):
    passages, pid_of = [], {}
    per_title = {}
    for ex in examples:
        if (ex["title"], ex["context"]) not in pid_of:
            idx = per_title.get(ex["title"], 0)
            per_title[ex["title"]] = idx + 1
            pid_of[(ex["title"], ex["context"])] = len(passages)
            passages.append({"title": ex["title"], "text": ex["context"], "passage_id": f"{ex['title']}#{idx}"})
    questions = [ex for ex in examples if ex["answers"]["text"]]
    if not questions:
        raise UserError("no answerable questions to build DPR examples from")

    scores, hits, _, _ = BM25(passages).search([q["question"] for q in questions], num_hard_negatives + 50)
    texts = [normalized(p["text"]) for p in passages]
    rng = random.Random(seed)
    out = []
    for q, ranked, ranked_scores in zip(questions, hits, scores):
        gold = pid_of[(q["title"], q["context"])]
        answers = answer_patterns(q["answers"]["text"])
        no_answer = lambda p: not holds_answer(texts[p], answers)  # noqa: E731
        hard = [(int(p), float(s)) for p, s in zip(ranked, ranked_scores) if p != gold and s > 0 and no_answer(p)]
        hard = hard[:num_hard_negatives]
        taken = {gold} | {p for p, _ in hard}
        candidates = [p for p in range(len(passages)) if p not in taken and no_answer(p)]
        negatives = rng.sample(candidates, min(num_negatives, len(candidates)))
        out.append({"dataset": "squad", "id": q["id"], "question": q["question"], "answers": q["answers"]["text"],
                    "positive_ctxs": [passages[gold]],
                    "negative_ctxs": [passages[p] for p in negatives],
                    "hard_negative_ctxs": [{**passages[p], "score": round(s, 4)} for p, s in hard]})
    return out, passages


@dataclass(frozen=True)
class ConvertArgs:
    POSITIONAL: ClassVar[str] = "squad_files"  # the files may also be given as plain words, before or after the flags
    squad_files: Optional[list[str]] = arg(None, "SQuAD v1.1/v2.0 JSON (or flattened) files to convert (also as "
                                                 "plain words: make_dpr_data.py a.json b.json --output dpr.json).",
                                           nargs="+")
    output: str = arg(None, "The DPR JSON to write.", aliases=["--out"])
    passages: Optional[str] = arg(None, "Also write every paragraph as JSON lines (the retrieval corpus).")
    num_hard_negatives: int = arg(2, "BM25 hard negatives per question.")
    num_negatives: int = arg(1, "Random negatives per question.")
    seed: int = arg(13, "Seed of the random negatives.")

    def __post_init__(self):
        if not self.squad_files:
            raise UserError("give the SQuAD files to convert")
        if not self.output:
            raise UserError("give --output (the DPR JSON to write)")


FLAGS = (ConvertArgs,)


@exit_on_user_error
def main(argv=None):
    (args,) = parse_args(FLAGS, argv)
    examples = [ex for path in args.squad_files for ex in load_squad(path)[0]]
    data, passages = build(examples, args.num_hard_negatives, args.num_negatives, args.seed)
    for path in filter(None, (args.output, args.passages)):
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        except OSError as err:
            raise UserError(f"{path}: cannot create its directory ({err.strerror or err})") from None
    write_json_file(args.output, data)
    if args.passages:
        write_json_lines(args.passages, passages)
    print(f"{args.output}: {len(data)} questions, {len(passages)} passages", file=sys.stderr)


if __name__ == "__main__":
    main()
