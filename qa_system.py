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
from utils.loop.args import arg, parse_args, process_group_timeout_arg
from utils.loop.output_dir import prepare_output_dir, publish_dir
from utils.loop.process import finish, make_accelerator
from utils.reader.trained import fingerprint
from utils.search.index import Index
from utils.system.answer import READING_STATS, at_share, combine
from utils.system.inputs import SystemArgs, build_system
from utils.system.measure import (combined_at, crossfit, fit_calibration, labelled, questions_per_second,
                                  reading_share, recall, scores, tune, weight_grid)
from utils.system.pipeline import QASystem, answer_of

logger = logging.getLogger("qa-amp")


@dataclass
class QAArgs(SystemArgs):
    questions: str = arg(None, "Questions to answer: SQuAD v1.1/v2.0 JSON (with answers the system is measured), or "
                               "JSON lines of {id, question} (optionally context, answers). Every question needs an id.")
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
    """(the eval k's, top_k, a note): k's beyond the corpus read every passage, so they are measured once, at its
    size, and said so."""
    beyond = [k for k in args.eval_k + [args.top_k] if k > passages]
    note = (f"k = {', '.join(map(str, sorted(set(beyond))))} beyond the {passages} passages of the corpus: read at "
            f"{passages}" if beyond else None)
    return sorted({min(k, passages) for k in args.eval_k}), min(args.top_k, passages), note


@exit_on_user_error
def main(argv=None):
    # --- setup ---------------------------------------------------------------------------------------
    args = parse_args(QAArgs, argv)
    accelerator = make_accelerator(args.process_group_timeout)  # each model runs under its own autocast (utils.reader.trained, utils.retriever.retriever)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S",
                        level=logging.INFO if accelerator.is_main_process else logging.ERROR)
    # refused if it holds anything; nothing created before the end
    prepare_output_dir(accelerator, args.output_dir, "evaluate", overwrite=args.overwrite_output_dir)

    # --- data: the questions, the corpus -------------------------------------------------------------------
    questions = load_questions(args.questions, need_context=False)[: args.max_questions]
    validation = None
    if args.validation_file:
        same_path = os.path.realpath(args.validation_file) == os.path.realpath(args.questions)
        validation = questions if same_path else load_questions(args.validation_file, need_context=False)
        if not labelled(validation):
            raise UserError(f"{args.validation_file}: the threshold is tuned on labelled questions (SQuAD JSON with "
                            "answers)")
    same_file = validation is not None and fingerprint(validation) == fingerprint(questions)
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
        bands = sorted(set(bands) | {top_k})
        k = bands[-1]
        ranking = "hybrid with BM25" if system.hybrid else "dense" if system.index else "BM25"
        precisions = system.precisions
        accelerator.print(f"qa: {len(system.passages)} passages, ranking {ranking}, k={bands}, answer rule "
                          f"{'question (shared normalization)' if system.shared else 'window'}; precision "
                          + ", ".join(f"{part} {p}" for part, p in precisions.items())
                          + (" (as trained)" if args.mixed_precision is None else "") + (f"\nqa: {clamped}" if clamped else ""))

        # --- answer ------------------------------------------------------------------------------------
        retrieved, readings, times = answer_all(accelerator, system, questions, k, bands)
        is_labelled = labelled(questions)
        gold = read_gold(accelerator, system, questions) if is_labelled and all(q["context"] for q in questions) \
            else None
        v_readings = v_gold = v_folds = None
        if args.no_answer_threshold is None and validation is not None:
            v_readings = readings if same_file else answer_all(accelerator, system, validation, k, [k])[1]
            v_gold = gold if same_file else read_gold(accelerator, system, validation)
            v_folds = cross_fit_folds(validation)
        source = ("given" if args.no_answer_threshold is not None else
                  "tuned on this very file: an upper bound (crossfit: each half of its articles answered as tuned on "
                  "the other)" if same_file and v_folds else
                  "tuned on this very file: an upper bound (one article: no folds to cross-fit over)" if same_file else
                  f"tuned on {args.validation_file}" if validation is not None else "the reader's recorded threshold")
        if v_readings is not None and args.retriever_weight is None:
            source += ("; the weight cross-fitted over two folds of its articles" if v_folds else
                       "; the weight tuned on it as a whole")

        def tuned(tuning_readings, kk, fuse=True):
            """(retriever weight, threshold, calibration) at kk: given, tuned and fitted on the
            validation questions, or the reader's threshold with no fusion; gold paragraphs, one passage without a
            retrieval score, are read unfused."""
            weight = system.retriever_weight if fuse else 0.0
            given = tuple(args.no_answer_calibration) if args.no_answer_calibration else None
            if args.no_answer_threshold is not None:
                return weight, args.no_answer_threshold, given
            if tuning_readings is None:
                return weight, system.recorded_threshold, given
            grid = weight_grid(args.retriever_weight) if fuse else [weight]
            weight, threshold = tune(validation, lambda w: combined_at(tuning_readings, kk, system.shared, w), grid,
                                     v_folds)
            if given or (not fuse and args.unanswerable_share is None):  # the ceiling needs none unless moved
                return weight, threshold, given
            fitted = fit_calibration(validation, combined_at(tuning_readings, kk, system.shared, weight))
            return weight, threshold, fitted

        def crossfitted(kk):
            """EM/F1 of the validation questions (here the questions answered), each fold of whole articles answered
            at the weight and threshold tuned on the other, as tuned() tunes them, and moved to
            --unanswerable_share as the row's are (by the calibration given, or fitted on the other fold): the
            row's score on articles it was not tuned on, where the row itself is an upper bound."""
            of = {q["id"]: r for q, r in zip(validation, v_readings)}
            given = tuple(args.no_answer_calibration) if args.no_answer_calibration else None

            def combined(qs, weight):
                return combined_at([of[q["id"]] for q in qs], kk, system.shared, weight)

            def settle(others):
                weight, threshold = tune(others, lambda w: combined(others, w), weight_grid(args.retriever_weight),
                                         cross_fit_folds(others))
                if args.unanswerable_share is not None:
                    threshold = moved(threshold, given or fit_calibration(others, combined(others, weight)))[0]
                return weight, threshold
            return crossfit(v_folds, settle, combined)[0]

        def moved(threshold, calibration):
            """(threshold, calibration, why not moved) at --unanswerable_share. A calibration fitted with a slope not
            above 0 (the log ratio does not order the validation questions' no-answers) moves nothing: the row says
            why."""
            if args.unanswerable_share is None:
                return threshold, calibration, None
            try:
                return (*at_share(threshold, calibration, args.unanswerable_share), None)
            except UserError as err:
                return threshold, calibration, str(err)

        settings = {kk: tuned(v_readings, kk) for kk in bands}
        # what each k answers with: its settings moved to the expected share of unanswerable questions, if given
        applied = {kk: (weight, *moved(threshold, calibration))
                   for kk, (weight, threshold, calibration) in settings.items()}

        # --- measure, write ----------------------------------------------------------------------------
        rows = []
        for kk in bands:
            weight, threshold, calibration = settings[kk]
            row = {"k": kk, "threshold": threshold, "retriever_weight": weight,
                   "no_answer_calibration": calibration}
            if args.unanswerable_share is not None:
                row.update(unanswerable_share=args.unanswerable_share, threshold_at_share=applied[kk][1],
                           **({"not_moved": applied[kk][3]} if applied[kk][3] else {}))
            row.update(questions_per_second=questions_per_second(times, kk, len(questions)),
                       reading_share=reading_share(times, kk))
            if is_labelled:
                row["recall"] = recall(questions, retrieved, kk)
                combined = combined_at(readings, kk, system.shared, weight)
                row.update(scores(questions, combined, applied[kk][1]))
                if args.unanswerable_share is not None:  # what the share changed: the same answers, as tuned
                    row["at_threshold"] = headline(scores(questions, combined, threshold))
                if same_file and v_folds:
                    row["crossfit"] = headline(crossfitted(kk))
            rows.append(row)
        ceiling = None
        if gold is not None:
            _, gold_threshold, gold_calibration = tuned(v_gold, 1, fuse=False)
            at, _, not_moved = moved(gold_threshold, gold_calibration)
            combined = combined_at(gold, 1, system.shared)
            ceiling = {"threshold": gold_threshold, **scores(questions, combined, at)}
            if args.unanswerable_share is not None:
                ceiling.update(threshold_at_share=at,
                               at_threshold=headline(scores(questions, combined, gold_threshold)),
                               **({"not_moved": not_moved} if not_moved else {}))
        write_outputs(accelerator, out, questions, retrieved, readings, top_k, applied[top_k][:3], system.shared)
        write_json(accelerator, os.path.join(out, "eval_results.json"),
                   {"retriever": args.retriever, "reader": args.reader, "questions": args.questions,
                    "passages": len(system.passages), "hybrid": system.hybrid, "threshold_source": source,
                    "rule": "question" if system.shared else "window",
                    "unanswerable_share": args.unanswerable_share, "processes": accelerator.num_processes,
                    "precision": precisions,
                    "precision_as_trained": args.mixed_precision is None, "k_note": clamped, "rows": rows,
                    "gold_paragraphs": ceiling})
    for r in rows:
        accelerator.print("  ".join(f"{key} {_fmt(value)}" for key, value in r.items()))
    if ceiling:
        accelerator.print("gold paragraphs (the ceiling): " + "  ".join(f"{key} {_fmt(v)}" for key, v in ceiling.items()))
    accelerator.print(f"threshold and weights: {source}; predictions.json at k={top_k} in {args.output_dir}")
    finish(accelerator)


def read_gold(accelerator, system: QASystem, questions: list[dict]) -> list[list[dict]]:
    """Each question's own paragraph read alone: the reader's score under the system's rule (its ceiling)."""
    with accelerator.split_between_processes(questions) as mine:
        part = system.read([q["question"] for q in mine], [[{"passage_id": "gold", "text": q["context"]}] for q in mine])
        results = [(q["id"], r) for q, r in zip(mine, part)]
    gathered = dict(gather_object(results))
    return [gathered[q["id"]] for q in questions]


def headline(metrics: dict) -> dict:
    """EM, F1 and HasAns/NoAns F1 of a squad_metrics result (what a second threshold's scores are shown with)."""
    return {k: metrics[k] for k in ("exact", "f1", "HasAns_f1", "NoAns_f1") if k in metrics}


def _fmt(value):
    if isinstance(value, dict):
        return "(" + ", ".join(f"{key} {_fmt(v)}" for key, v in value.items()) + ")"
    return f"{value:.2f}" if isinstance(value, float) else value


def write_outputs(accelerator, directory, questions, retrieved, readings, top_k, setting, shared) -> None:
    """predictions.json ({id: answer text}, the official SQuAD v2 evaluation's input) and details.jsonl: per
    question its answer at top_k, the passage it was taken from and its score (null on an abstention), its
    offsets in that passage, the log ratio the threshold compares (null_minus_best), and every passage read
    (retrieval score, best span, span and null scores, null for a passage without a span). `setting`: (retriever
    weight, threshold, calibration) at top_k."""
    if not accelerator.is_main_process:
        return
    retriever_weight, threshold, calibration = setting
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
