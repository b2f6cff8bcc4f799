"""Answer questions over a corpus with a trained retriever and a trained reader, and measure the system as a whole.

Runbook (from the repository root, after `pip install -r requirements.txt`):

  python qa_system.py --retriever outputs/dpr-squad --reader outputs/reader-squad \
      --passages ../shared/data/dpr/passages.jsonl --questions ../shared/data/squad/dev.json \
      --validation_file ../shared/data/squad/dev.json --mixed_precision bf16 --output_dir outputs/qa
      Retrieves (dense + BM25 hybrid at the retriever's recorded weight), reads the top passages and answers;
      with labelled questions it reports, for k = 1, 3, 5, 10 passages read, end-to-end EM/F1 (total, HasAns,
      NoAns), the retriever's recall@k of an answer-bearing passage, the reader's F1 on the gold paragraphs (the
      ceiling) and questions/s. The no-answer threshold and the weight of the retriever's score in the answer are
      tuned, and the probability of no answer calibrated, on --validation_file for each k: the weight with the best
      F1 cross-fitted over two folds of its whole articles (each fold answered at the threshold tuned on the
      other), then the threshold on all of it. Here it is the same file: the rows are an upper bound, said so, and
      each also comes cross-fitted (each fold answered at the weight and threshold tuned on the other). Give the
      row's settings to serve.py as --no_answer_threshold, --retriever_weight and --no_answer_calibration.
      docs/RESULTS.md has the numbers. With --unanswerable_share S (the share of questions expected to have no
      answer, where it differs from --validation_file's) each k's threshold and calibration move to S by its odds
      (utils/system/answer.py) and the rows are scored there.

  python qa_system.py --retriever bm25 --reader outputs/reader-squad --passages corpus.jsonl \
      --questions questions.jsonl --no_answer_threshold -3.2 --output_dir outputs/qa-bm25
      BM25 instead of a trained retriever; JSON lines of {"id", "question"}; a threshold tuned before.

  accelerate launch qa_system.py ...      several processes: each answers its share of the questions.

Skeleton: setup -> data (questions, the index of the corpus) -> answer (retrieve, read, the rule of
utils/system/answer.py) -> measure. Outputs in --output_dir, written together when the run ends (an --output_dir
holding an earlier run's is refused unless --overwrite_output_dir, and then replaced as a whole; an interrupted run
leaves nothing): predictions.json (id -> answer text, "" for no answer, at --top_k: what the official SQuAD v2
evaluation script reads), details.jsonl (per question the answer, the passage it was taken from and its score,
null when the system abstains, and the passages read with each one's best span and null score), eval_results.json
(the table, with each k's threshold and weight, the precision each model ran at) and, with --passages and a trained
retriever, index/ (the corpus indexed: give it as --index next time).
"""

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Optional

from accelerate.utils import gather_object

from utils.errors import UserError, exit_on_user_error
from utils.files.corpus import load_passages
from utils.files.folds import cross_fit_folds
from utils.files.jsonfiles import json_line, write_json
from utils.files.squad import load_questions
from utils.reader.trained import fingerprint
from utils.runtime.flags import arg, parse_args, process_group_timeout_arg
from utils.runtime.output_dir import prepare_output_dir, publish_dir
from utils.runtime.process import finish, make_accelerator
from utils.search.index import Index
from utils.system.answer import READING_STATS, combine
from utils.system.inputs import SystemArgs, build_system
from utils.system.measure import (Tuning, gold_row, labelled, questions_per_second, reading_share, system_row,
                                  system_setting)
from utils.system.pipeline import QASystem, answer_of

logger = logging.getLogger("qa-amp")


@dataclass
class QAArgs(SystemArgs):
    questions: str = arg(None, "Questions to answer: SQuAD v1.1/v2.0 JSON (with answers the system is measured), or "
                               "JSON lines of {id, question} (optionally context, answers). Every question needs an "
                               "id.")
    validation_file: Optional[str] = arg(None, "Labelled SQuAD JSON to tune the system's no-answer threshold and "
                                               "weights on, for each number of passages read (instead of "
                                               "--no_answer_threshold; each weight too unless given): the weight "
                                               "cross-fitted over two folds of its whole articles, the threshold "
                                               "on all of it.")
    top_k: int = arg(5, "Passages read per question for predictions.json (at most the corpus).")
    eval_k: list[int] = field(default_factory=lambda: [1, 3, 5, 10], metadata={
        "help": "The numbers of passages read that the measurement reports (one retrieval, one reading, at the "
                "largest; at most the corpus).", "nargs": "+"})
    max_questions: Optional[int] = arg(None, "Answer the first N questions only (quick runs).")
    output_dir: str = arg("outputs/qa", "Where predictions.json, details.jsonl and eval_results.json go.")
    overwrite_output_dir: bool = arg(False, "Use output_dir even if it holds an earlier run's outputs, a trained "
                                            "model or files of no run of this project: they are replaced.")
    process_group_timeout: int = process_group_timeout_arg()  # an index built from --passages: BM25 by one process

    def tuning(self) -> Tuning:
        """The answer rule's settings given here; the rest is tuned on --validation_file (utils.system.measure)."""
        calibration = tuple(self.no_answer_calibration) if self.no_answer_calibration else None
        return Tuning(self.no_answer_threshold, self.retriever_weight, calibration, self.unanswerable_share)

    def validate(self) -> None:
        if not self.questions:
            raise UserError("give --questions (and --retriever, --reader, the corpus)")
        self.check_input_files("questions", "validation_file")
        self.validate_system(fits_calibration=self.validation_file is not None and self.no_answer_threshold is None)
        self.check_at_least_one("top_k", "max_questions", "process_group_timeout")
        if min(self.eval_k) < 1:
            raise UserError(f"--eval_k must be at least 1 (got {min(self.eval_k)})")
        self.eval_k = sorted(set(self.eval_k))
        out = os.path.realpath(self.output_dir)
        for name in ("reader", "retriever", "index", "questions", "passages", "validation_file"):
            path = getattr(self, name)
            if path and path != "bm25" and (os.path.realpath(path) + os.sep).startswith(out + os.sep):
                raise UserError(f"--output_dir {self.output_dir} holds --{name} {path}: give another --output_dir")


def answer_all(accelerator, system: QASystem, questions: list[dict], k: int, bands: list[int]) -> tuple:
    """(retrieved, readings, seconds): this process's share of the questions retrieved at k and read band by band
    (passages 1..bands[0], then up to bands[1], ...), so the time to answer with each band's k is measured exactly;
    gathered on every process. With an index whose shards are spread over the processes, every process retrieves
    every question from its shards (a collective; the results merged), then reads its share."""
    spread = system.index is not None and system.index.distributed
    t0 = time.perf_counter()
    everything = system.retrieve([q["question"] for q in questions], k) if spread else None
    with accelerator.split_between_processes(list(range(len(questions)))) as share:
        mine = [questions[i] for i in share]
        texts = [q["question"] for q in mine]
        retrieved = [everything[i] for i in share] if spread else system.retrieve(texts, k) if texts else []
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


def clamp_k(args, passages: int) -> tuple[list[int], int, str | None]:
    """(the k's measured: the eval k's and top_k, top_k, a note): k's beyond the corpus read every passage, so they
    are measured once, at its size, and said so."""
    beyond = [k for k in args.eval_k + [args.top_k] if k > passages]
    note = (f"k = {', '.join(map(str, sorted(set(beyond))))} beyond the {passages} passages of the corpus: read at "
            f"{passages}" if beyond else None)
    top_k = min(args.top_k, passages)
    return sorted({min(k, passages) for k in args.eval_k} | {top_k}), top_k, note


@exit_on_user_error
def main(argv=None):
    # --- setup ---------------------------------------------------------------------------------------
    args = parse_args(QAArgs, argv)
    # each model runs under its own autocast (utils.reader.trained, utils.retriever.retriever)
    accelerator = make_accelerator(args.process_group_timeout)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S",
                        level=logging.INFO if accelerator.is_main_process else logging.ERROR)
    # refused if it holds anything; nothing created before the end
    prepare_output_dir(accelerator, args.output_dir, "evaluate", overwrite=args.overwrite_output_dir)

    # --- data: the questions, the corpus -------------------------------------------------------------------
    questions, validation, same_file = load_inputs(args)
    accelerator.print(f"qa: retriever={args.retriever} reader={args.reader} questions={len(questions)} "
                      f"corpus={args.passages or args.index} processes={accelerator.num_processes}")
    share = (accelerator.process_index, accelerator.num_processes)
    # each process maps only its share of the index's shards and searches them (checked against the retriever)
    index = Index.load(args.index, share=share) if args.index else None
    passages = load_passages(args.passages) if args.retriever == "bm25" else None

    with publish_dir(accelerator, args.output_dir, state="evaluated") as out:  # all outputs at the end, or none
        # the share moves each k's own settings below, so the system itself answers as tuned
        system = build_system(args.system_config(with_share=False), accelerator, passages, index,
                              index_dir=os.path.join(out, "index"))
        bands, top_k, clamped = clamp_k(args, len(system.passages))
        k = bands[-1]
        announce(accelerator, args, system, bands, clamped)

        # --- answer: the questions, and the validation questions where the settings are tuned on them ----
        retrieved, readings, times = answer_all(accelerator, system, questions, k, bands)
        gold = None  # each question's own paragraph read alone: the reader's ceiling
        if labelled(questions) and all(q["context"] for q in questions):
            gold = read_gold(accelerator, system, questions)
        v_readings = v_gold = v_folds = None
        if args.no_answer_threshold is None and validation is not None:
            v_readings = readings if same_file else answer_all(accelerator, system, validation, k, [k])[1]
            v_gold = gold if same_file else read_gold(accelerator, system, validation)
            v_folds = cross_fit_folds(validation)

        # --- measure: each k's setting by the tuning policy (utils/system/measure.py), then what it scores --
        tuning = args.tuning()
        settings = {kk: system_setting(tuning, system.recorded_threshold, validation, v_readings, kk, system.shared,
                                       v_folds) for kk in bands}
        timing = {kk: {"questions_per_second": questions_per_second(times, kk, len(questions)),
                       "reading_share": reading_share(times, kk)} for kk in bands}
        rows = [system_row(tuning, settings[kk], kk, timing[kk], questions, retrieved, readings, system.shared,
                           v_folds if same_file else None) for kk in bands]
        ceiling = None
        if gold is not None:  # the same policy, unfused, on the gold paragraphs
            ceiling = gold_row(tuning, system_setting(tuning, system.recorded_threshold, validation, v_gold, 1,
                                                      system.shared, v_folds, fuse=False),
                               questions, gold, system.shared)
        source = threshold_source(args, same_file, v_folds, v_readings is not None)

        # --- write -----------------------------------------------------------------------------------------
        write_outputs(accelerator, out, questions, retrieved, readings, top_k, settings[top_k], system.shared)
        write_json(accelerator, os.path.join(out, "eval_results.json"),
                   {"retriever": args.retriever, "reader": args.reader, "questions": args.questions,
                    "passages": len(system.passages), "hybrid": system.hybrid, "threshold_source": source,
                    "rule": "question" if system.shared else "window",
                    "unanswerable_share": args.unanswerable_share, "processes": accelerator.num_processes,
                    "precision": system.precisions, "precision_as_trained": args.mixed_precision is None,
                    "k_note": clamped, "rows": rows, "gold_paragraphs": ceiling})
    for r in rows:
        accelerator.print("  ".join(f"{key} {_fmt(value)}" for key, value in r.items()))
    if ceiling:
        accelerator.print("gold paragraphs (the ceiling): "
                          + "  ".join(f"{key} {_fmt(v)}" for key, v in ceiling.items()))
    accelerator.print(f"threshold and weights: {source}; predictions.json at k={top_k} in {args.output_dir}")
    finish(accelerator)


def load_inputs(args) -> tuple[list[dict], list[dict] | None, bool]:
    """(the questions, the validation questions or None, whether they are the same questions)."""
    questions = load_questions(args.questions, need_context=False)[: args.max_questions]
    validation = None
    if args.validation_file:
        same_path = os.path.realpath(args.validation_file) == os.path.realpath(args.questions)
        validation = questions if same_path else load_questions(args.validation_file, need_context=False)
        if not labelled(validation):
            raise UserError(f"{args.validation_file}: the threshold is tuned on labelled questions (SQuAD JSON with "
                            "answers)")
    return questions, validation, validation is not None and fingerprint(validation) == fingerprint(questions)


def announce(accelerator, args, system: QASystem, bands: list[int], clamped: str | None) -> None:
    """What the system ranks and reads with, and at which precision."""
    ranking = "hybrid with BM25" if system.hybrid else "dense" if system.index else "BM25"
    accelerator.print(f"qa: {len(system.passages)} passages, ranking {ranking}, k={bands}, answer rule "
                      f"{'question (shared normalization)' if system.shared else 'window'}; precision "
                      + ", ".join(f"{part} {p}" for part, p in system.precisions.items())
                      + (" (as trained)" if args.mixed_precision is None else "")
                      + (f"\nqa: {clamped}" if clamped else ""))


def read_gold(accelerator, system: QASystem, questions: list[dict]) -> list[list[dict]]:
    """Each question's own paragraph read alone: the reader's score under the system's rule (its ceiling)."""
    with accelerator.split_between_processes(questions) as mine:
        gold = [[{"passage_id": "gold", "text": q["context"]}] for q in mine]
        part = system.read([q["question"] for q in mine], gold)
        results = [(q["id"], r) for q, r in zip(mine, part)]
    gathered = dict(gather_object(results))
    return [gathered[q["id"]] for q in questions]


def threshold_source(args, same_file: bool, folds, tuned: bool) -> str:
    """Where the rows' thresholds and weights come from, as eval_results.json and the last line say."""
    source = ("given" if args.no_answer_threshold is not None else
              "tuned on this very file: an upper bound (crossfit: each half of its articles answered as tuned on "
              "the other)" if same_file and folds else
              "tuned on this very file: an upper bound (one article: no folds to cross-fit over)" if same_file else
              f"tuned on {args.validation_file}" if args.validation_file is not None else
              "the reader's recorded threshold")
    if tuned and args.retriever_weight is None:
        source += ("; the weight cross-fitted over two folds of its articles" if folds else
                   "; the weight tuned on it as a whole")
    return source


def _fmt(value):
    if isinstance(value, dict):
        return "(" + ", ".join(f"{key} {_fmt(v)}" for key, v in value.items()) + ")"
    return f"{value:.2f}" if isinstance(value, float) else value


def write_outputs(accelerator, directory, questions, retrieved, readings, top_k, setting, shared) -> None:
    """predictions.json ({id: answer text}, the official SQuAD v2 evaluation's input) and details.jsonl: per
    question its answer at top_k, the passage it was taken from and its score (null on an abstention), its
    offsets in that passage, the log ratio the threshold compares (null_minus_best), and every passage read
    (retrieval score, best span, span and null scores, null for a passage without a span). `setting`: top_k's
    (utils.system.measure.Setting), as applied."""
    if not accelerator.is_main_process:
        return
    retriever_weight, threshold, calibration = setting.weight, setting.applied_threshold, setting.applied_calibration
    predictions = {}
    with open(os.path.join(directory, "details.jsonl"), "w", encoding="utf-8") as f:
        for q, passages, reads in zip(questions, retrieved, readings):
            a = answer_of(combine(reads[:top_k], shared, retriever_weight=retriever_weight, calibration=calibration),
                          threshold, passages[:top_k], reads[:top_k])
            predictions[q["id"]] = a["answer"]
            f.write(json_line({"id": q["id"], "question": q["question"], "answer": a["answer"],
                               "passage_id": a["passage_id"], "score": a["score"], "start": a["start"],
                               "end": a["end"], "null_minus_best": a["null_minus_best"],
                               "no_answer_probability": a["no_answer_probability"], "top_k": top_k,
                               "rule": "question" if shared else "window",
                               "passages": [{"passage_id": p["passage_id"], "score": p["score"], "span": r["text"],
                                             "span_score": r["score"], "null_score": r["null_score"],
                                             "nbest": [{"text": x["text"], "score": x["score"]} for x in r["nbest"]],
                                             **{k: r[k] for k in READING_STATS}}
                                            for p, r in zip(passages, reads)]}) + "\n")
    write_json(accelerator, os.path.join(directory, "predictions.json"), predictions)


if __name__ == "__main__":
    main()
