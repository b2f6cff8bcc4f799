"""Answer questions over a corpus with a trained retriever and a trained reader, and measure the system as a whole.

Runbook (from the repository root, after `pip install -r requirements.txt`):

  python qa_system.py --retriever outputs/dpr-squad --reader outputs/reader-squad \
      --passages ../shared/data/dpr/passages.jsonl --questions ../shared/data/squad/dev.json \
      --validation_file ../shared/data/squad/dev.json --mixed_precision bf16 --output_dir outputs/qa
      Retrieves (dense + BM25 hybrid at the retriever's recorded weight), reads the top passages and answers;
      with labelled questions it reports, for k = 1, 3, 5, 10 passages read, end-to-end EM/F1 (total, HasAns,
      NoAns), the retriever's recall@k of an answer-bearing passage, the reader's F1 on the gold paragraphs (the
      ceiling) and questions/s. The threshold is tuned on --validation_file (here the same file: an upper bound,
      and said so). docs/RESULTS.md has the numbers.

  python qa_system.py --retriever bm25 --reader outputs/reader-squad --passages corpus.jsonl \
      --questions questions.jsonl --no_answer_threshold -3.2 --output_dir outputs/qa-bm25
      BM25 instead of a trained retriever; JSON lines of {"id", "question"}; a threshold tuned before.

  accelerate launch qa_system.py ...      several processes: each answers its share of the questions.

Skeleton: setup -> data (questions, the index of the corpus) -> answer (retrieve, read, the rule of
utils/system/answer.py) -> measure. Outputs in --output_dir: predictions.json (id -> {"answer", "passage_id",
"score"}; "" for no answer) at --top_k, details.jsonl (per question the passages read, each one's best span and
null score), eval_results.json (the table and thresholds).
"""

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Literal, Optional

from accelerate import Accelerator
from accelerate.utils import gather_object

from utils.loop.args import arg, check_input_files, parse_args
from utils.loop.errors import UserError, exit_on_user_error
from utils.loop.jsonfiles import json_line, write_json
from utils.loop.output_dir import prepare_output_dir
from utils.loop.process import finish
from utils.system.answer import answer
from utils.system.measure import (combined_at, fingerprint_of, load_questions, questions_per_second,
                                  reading_share, recall, scores, tune_threshold)
from utils.retriever.index import Retriever
from utils.system.pipeline import QASystem

logger = logging.getLogger("qa-amp")


@dataclass
class QAArgs:
    retriever: str = arg(None, "A retriever trained by train_dpr.py (its output directory), or bm25.")
    reader: str = arg(None, "A reader trained by train_reader.py (its output directory).")
    questions: str = arg(None, "Questions to answer: SQuAD v1.1/v2.0 JSON (with answers the system is measured), or "
                               "JSON lines of {id, question}.")
    passages: Optional[str] = arg(None, "The corpus: JSON lines of {title, text, passage_id}.")
    index: Optional[str] = arg(None, "Instead of --passages: an index of the corpus saved by the Retriever API.")
    validation_file: Optional[str] = arg(None, "Labelled SQuAD JSON to tune the system's no-answer threshold on, for "
                                               "each number of passages read.")
    no_answer_threshold: Optional[float] = arg(None, "The system's no-answer threshold, tuned before. Default: tuned "
                                                     "on --validation_file, else the reader's recorded threshold.")
    top_k: int = arg(5, "Passages read per question for predictions.json.")
    eval_k: list[int] = field(default_factory=lambda: [1, 3, 5, 10], metadata={
        "help": "The numbers of passages read that the measurement reports (one retrieval, one reading, at the "
                "largest).", "nargs": "+"})
    hybrid: Optional[bool] = arg(None, "Fuse the dense ranking with BM25 at the retriever's recorded weight. "
                                       "Default: when the retriever has one.")
    mixed_precision: Optional[Literal["no", "fp16", "bf16"]] = arg(None, "Autocast precision of the encoders and "
                                                                         "the reader. Default: the launcher's, else no.")
    batch_size: int = arg(64, "Texts per forward pass (questions, passages, reader windows).")
    max_questions: Optional[int] = arg(None, "Answer the first N questions only (quick runs).")
    output_dir: str = arg("outputs/qa", "Where predictions.json, details.jsonl and eval_results.json go.")
    overwrite_output_dir: bool = arg(False, "Use output_dir even if it holds a trained model or files of no run of "
                                            "this project.")
    resume_from_checkpoint = None  # the output directory check's; nothing resumes here

    def validate(self) -> None:
        if not self.retriever or not self.reader or not self.questions:
            raise UserError("give --retriever (a trained retriever or bm25), --reader and --questions")
        check_input_files(self, "questions", "passages", "validation_file")
        if self.retriever != "bm25" and not os.path.isdir(self.retriever):
            raise UserError(f"{self.retriever}: no such directory (give a retriever trained by train_dpr.py, or bm25)")
        if (self.passages is None) == (self.index is None):
            raise UserError("give the corpus as --passages, or as a saved --index (one of them)")
        if self.retriever == "bm25" and self.index:
            raise UserError("--index holds dense vectors: the BM25 retriever needs --passages")
        if self.top_k < 1 or min(self.eval_k) < 1 or self.batch_size < 1:
            raise UserError("--top_k, --eval_k and --batch_size must be at least 1")
        self.eval_k = sorted(set(self.eval_k))


def answer_all(accelerator, system: QASystem, questions: list[dict], k: int, bands: list[int]) -> tuple:
    """(retrieved, readings, seconds): this process's share of the questions retrieved at k and read band by band
    (passages 1..bands[0], then up to bands[1], ...), so the time to answer with each band's k is measured exactly;
    gathered on every process."""
    with accelerator.split_between_processes(questions) as mine:
        texts = [q["question"] for q in mine]
        t0 = time.perf_counter()
        retrieved = system.retrieve(texts, k) if texts else []
        seconds = {"retrieval": time.perf_counter() - t0}
        readings = [[] for _ in mine]
        first = 0
        for last in bands:
            t0 = time.perf_counter()
            part = system.read(texts, [passages[first:last] for passages in retrieved])
            for row, extra in zip(readings, part):
                row.extend(extra)
            seconds[f"read_{last}"] = time.perf_counter() - t0
            first = last
        results = [(q["id"], r, p) for q, r, p in zip(mine, retrieved, readings)]
    gathered = {i: (r, p) for i, r, p in gather_object(results)}
    times = gather_object([seconds])
    return [gathered[q["id"]][0] for q in questions], [gathered[q["id"]][1] for q in questions], times


@exit_on_user_error
def main(argv=None):
    # --- setup ---------------------------------------------------------------------------------------
    args = parse_args(QAArgs, argv)
    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S",
                        level=logging.INFO if accelerator.is_main_process else logging.ERROR)
    prepare_output_dir(accelerator, args, "evaluate")
    device = "cuda" if accelerator.device.type == "cuda" else "cpu"

    # --- data: the questions, the index of the corpus (built once, by the main process) ----------------
    questions = load_questions(args.questions)[: args.max_questions]
    validation = None
    if args.validation_file:
        same_path = os.path.realpath(args.validation_file) == os.path.realpath(args.questions)
        validation = questions if same_path else load_questions(args.validation_file)
        if validation[0]["answers"] is None:
            raise UserError(f"{args.validation_file}: the threshold is tuned on labelled questions (SQuAD JSON with "
                            "answers)")
    same_file = validation is not None and fingerprint_of(validation) == fingerprint_of(questions)
    index = args.index
    if args.retriever != "bm25" and index is None:  # embedded once, by the main process; the others map it
        index = os.path.join(args.output_dir, "index")
        if accelerator.is_main_process:
            Retriever(args.retriever, device=device, batch_size=args.batch_size).index(args.passages).save(index)
        accelerator.wait_for_everyone()
    system = QASystem(args.retriever, args.reader, passages=args.passages if args.retriever == "bm25" else None,
                      index=index, hybrid=args.hybrid, device=device, precision=accelerator.mixed_precision,
                      batch_size=args.batch_size)
    bands = sorted(set(args.eval_k) | {args.top_k})
    k = bands[-1]
    ranking = "hybrid with BM25" if system.hybrid else "dense" if system.index else "BM25"
    accelerator.print(f"qa: retriever={args.retriever} ({ranking}) reader={args.reader} questions={len(questions)} "
                      f"passages={len(system.passages)} k={bands} processes={accelerator.num_processes} "
                      f"precision={accelerator.mixed_precision}")

    # --- answer ----------------------------------------------------------------------------------------
    retrieved, readings, times = answer_all(accelerator, system, questions, k, bands)
    labelled = questions[0]["answers"] is not None
    gold = read_gold(accelerator, system, questions) if labelled and all(q["context"] for q in questions) else None
    v_readings = v_gold = None
    if args.no_answer_threshold is None and validation is not None:
        v_readings = readings if same_file else answer_all(accelerator, system, validation, k, [k])[1]
        v_gold = gold if same_file else read_gold(accelerator, system, validation)
    source = ("given" if args.no_answer_threshold is not None else
              "tuned on this very file: an upper bound" if same_file else
              f"tuned on {args.validation_file}" if validation is not None else "the reader's recorded threshold")

    def threshold(tuning_readings, kk):
        if args.no_answer_threshold is not None:
            return args.no_answer_threshold
        if tuning_readings is None:
            return system.recorded_threshold
        return tune_threshold(validation, combined_at(tuning_readings, kk))

    thresholds = {kk: threshold(v_readings, kk) for kk in bands}

    # --- measure, write --------------------------------------------------------------------------------
    rows = []
    for kk in bands:
        row = {"k": kk, "threshold": thresholds[kk], "questions_per_second": questions_per_second(times, kk, len(questions)),
               "reading_share": reading_share(times, kk)}
        if labelled:
            row["recall"] = recall(questions, retrieved, kk)
            row.update(scores(questions, combined_at(readings, kk), thresholds[kk]))
        rows.append(row)
    ceiling = None
    if gold is not None:
        gold_threshold = threshold(v_gold, 1)
        ceiling = {"threshold": gold_threshold, **scores(questions, combined_at(gold, 1), gold_threshold)}
    top = combined_at(readings, args.top_k)
    if accelerator.is_main_process:
        write_outputs(accelerator, args.output_dir, questions, retrieved, readings, top, thresholds[args.top_k])
    write_json(accelerator, os.path.join(args.output_dir, "eval_results.json"),
               {"retriever": args.retriever, "reader": args.reader, "questions": args.questions,
                "passages": len(system.passages), "hybrid": system.hybrid, "threshold_source": source,
                "processes": accelerator.num_processes, "precision": accelerator.mixed_precision, "rows": rows,
                "gold_paragraphs": ceiling})
    for r in rows:
        accelerator.print("  ".join(f"{key} {_fmt(value)}" for key, value in r.items()))
    if ceiling:
        accelerator.print("gold paragraphs (the ceiling): " + "  ".join(f"{key} {_fmt(v)}" for key, v in ceiling.items()))
    accelerator.print(f"threshold: {source}; predictions.json at k={args.top_k} in {args.output_dir}")
    finish(accelerator)


def read_gold(accelerator, system: QASystem, questions: list[dict]) -> list[list[dict]]:
    """Each question's own paragraph read alone: the reader's score under the system's rule (its ceiling)."""
    with accelerator.split_between_processes(questions) as mine:
        part = system.read([q["question"] for q in mine], [[{"passage_id": "gold", "text": q["context"]}] for q in mine])
        results = [(q["id"], r) for q, r in zip(mine, part)]
    gathered = dict(gather_object(results))
    return [gathered[q["id"]] for q in questions]


def _fmt(value):
    return f"{value:.2f}" if isinstance(value, float) else value


def write_outputs(accelerator, directory, questions, retrieved, readings, top, threshold) -> None:
    predictions = {q["id"]: {"answer": answer(c, threshold), "passage_id": c["passage_id"], "score": c["score"]}
                   for q, c in zip(questions, top)}
    write_json(accelerator, os.path.join(directory, "predictions.json"), predictions)
    with open(os.path.join(directory, "details.jsonl"), "w", encoding="utf-8") as f:
        for q, passages, reads in zip(questions, retrieved, readings):
            f.write(json_line({"id": q["id"], "question": q["question"], "answer": predictions[q["id"]]["answer"],
                               "passages": [{**{k: p[k] for k in ("passage_id", "score")}, "span": r["text"],
                                             "span_score": r["score"], "null_score": r["null_score"]}
                                            for p, r in zip(passages, reads)]}) + "\n")


if __name__ == "__main__":
    main()
