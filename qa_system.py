"""Answer questions over a corpus with a trained retriever and a trained reader, and measure the system as a whole.

Runbook (from the repository root, after `pip install -r requirements.txt`; what each output holds and how the
settings are tuned: docs/QA_SYSTEM.md; the numbers: docs/RESULTS.md):

  python qa_system.py --retriever outputs/dpr-squad --reader outputs/reader-squad \
      --passages ../shared/data/dpr/passages.jsonl --questions ../shared/data/squad/dev.json \
      --validation_file ../shared/data/squad/dev.json --mixed_precision bf16 --output_dir outputs/qa
      Retrieve, read the top passages, answer; for k = 1, 3, 5, 10 passages read: EM/F1, recall@k, the gold
      paragraphs' F1 (the ceiling), questions/s. The threshold, the retriever's weight and the calibration are tuned
      on --validation_file per k (the same file here: an upper bound, said so, each row also cross-fitted over its
      articles); give a row's settings to serve.py. --unanswerable_share S moves them to another expected share.

  python qa_system.py --retriever bm25 --reader outputs/reader-squad --passages corpus.jsonl \
      --questions questions.jsonl --no_answer_threshold -3.2 --output_dir outputs/qa-bm25
      BM25 instead of a trained retriever; JSON lines of {"id", "question"}; a threshold tuned before.

  python qa_system.py --retriever bm25 --reader outputs/reader-squad --passages corpus.jsonl \
      --questions nq-test.csv --validation_file nq-dev.jsonl --output_dir outputs/qa-nq
      Questions labelled by answer strings without a paragraph (DPR's question<TAB>["answer", ...] files, or JSON
      lines of {"id", "question", "answers": [...]}, [] for no answer): EM/F1 on the answer strings, recall@k by
      the one answer matcher; no gold-paragraph row (said so), and the tuning's folds are folds of questions.

  accelerate launch qa_system.py ...      several processes: each answers its share of the questions.

Skeleton: setup -> data (questions, the index of the corpus) -> answer (utils/system/question_set.py) -> measure (the
tuning policy, utils/system/measure.py) -> write predictions.json, details.jsonl, eval_results.json and, with
--passages and a trained retriever, index/ (give it as --index next time): all at the end, or nothing.
"""

import logging
import os
from dataclasses import dataclass, field, replace
from typing import Optional

from utils.errors import UserError, check_at_least_one, exit_on_user_error
from utils.files.corpus import load_passages
from utils.files.folds import cross_fit_folds
from utils.files.jsonfiles import write_json
from utils.index.index import Index
from utils.reader.trained import normalization
from utils.runtime.flags import arg, check_input_files, parse_args, process_group_timeout_arg
from utils.runtime.output_dir import OutputConfig, prepare_output_dir, publish_dir
from utils.runtime.process import finish, make_accelerator
from utils.system.answer import AnswerSettings
from utils.system.inputs import SystemConfig, build_system
from utils.system.measure import (ceiling_left_out, gold_row, labelled, measured_ks, system_row, system_setting,
                                  timing, tuning_source)
from utils.system.question_set import answer_all, load_inputs, read_gold, write_answers
from utils.system.report import announce, report

@exit_on_user_error
def main(argv=None):
    # --- setup ---------------------------------------------------------------------------------------
    args, config, answer_settings = resolve(*parse_args(FLAGS, argv))
    # each model runs under its own autocast (utils.reader.trained, utils.retriever.retriever)
    accelerator = make_accelerator(args.process_group_timeout)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S",
                        level=logging.INFO if accelerator.is_main_process else logging.ERROR)
    # refused if it holds anything; nothing created before the end
    prepare_output_dir(accelerator, args.output_dir, "evaluate", overwrite=args.overwrite_output_dir)

    # --- data: the questions, the corpus -------------------------------------------------------------
    questions, validation, same_file = load_inputs(args.questions, args.validation_file, args.max_questions)
    accelerator.print(f"qa: retriever={config.retriever} reader={config.reader} questions={len(questions)} "
                      f"corpus={config.passages or config.index} processes={accelerator.num_processes}")
    # each process maps only its share of the index's shards and searches them (checked against the retriever)
    index = config.index and Index.load(config.index, share=(accelerator.process_index, accelerator.num_processes))
    passages = load_passages(config.passages) if config.retriever == "bm25" and config.passages else None

    with publish_dir(accelerator, args.output_dir, state="evaluated") as out:  # all outputs at the end, or none
        # the share moves each k's own settings below, so the system itself answers as tuned
        system = build_system(config, replace(answer_settings, unanswerable_share=None), accelerator, passages, index,
                              index_dir=os.path.join(out, "index"))
        bands, answered_k, clamped = measured_ks(args.eval_k, config.k, len(system.passages))
        announce(accelerator, system, bands, clamped, as_trained=config.mixed_precision is None)

        # --- answer: the questions, and the validation questions where the settings are tuned on them ----
        retrieved, readings, times = answer_all(accelerator, system, questions, bands[-1], bands)
        tuned = answer_settings.no_answer_threshold is None and validation is not None
        left_out = ceiling_left_out(questions, validation, tuned)  # it needs the paragraphs
        gold = None  # each question's own paragraph read alone: the reader's ceiling
        if labelled(questions) and left_out is None:
            gold = read_gold(accelerator, system, questions)
        v_readings, v_gold, v_folds = None, None, None
        if tuned:
            k = bands[-1]  # read once at the largest k: each k's setting is tuned on its first k passages
            v_readings = readings if same_file else answer_all(accelerator, system, validation, k, [k])[1]
            v_gold = gold if same_file or gold is None else read_gold(accelerator, system, validation)
            v_folds = cross_fit_folds(validation)  # of whole articles; of questions where none is named

        # --- measure: each k's setting by the tuning policy (utils/system/measure.py), then what it scores --
        def setting(k, v_readings, fuse=True):
            return system_setting(answer_settings, system.null_threshold, validation, v_readings, k,
                                  system.shared_norm, v_folds, fuse)
        settings = {k: setting(k, v_readings) for k in bands}
        rows = [system_row(answer_settings, settings[k], k, timing(times, k, len(questions)), questions, retrieved,
                           readings, system.shared_norm, v_folds if same_file else None) for k in bands]
        # the same policy, unfused, on the gold paragraphs
        ceiling = None if gold is None else gold_row(answer_settings, setting(1, v_gold, fuse=False), questions, gold,
                                                     system.shared_norm)
        source = tuning_source(answer_settings, args.validation_file, same_file, v_folds, v_readings is not None)

        # --- write -----------------------------------------------------------------------------------------
        write_answers(accelerator, out, questions, retrieved, readings, answered_k, settings[answered_k],
                      system.shared_norm)
        write_json(accelerator, os.path.join(out, "eval_results.json"),
                   {"retriever": config.retriever, "reader": config.reader, "questions": args.questions,
                    "passages": len(system.passages), "hybrid": system.hybrid, "threshold_source": source,
                    "rule": normalization(system.shared_norm),
                    "unanswerable_share": answer_settings.unanswerable_share, "processes": accelerator.num_processes,
                    "precision": system.precisions, "precision_as_trained": config.mixed_precision is None,
                    "k_note": clamped, "rows": rows, "gold_paragraphs": ceiling,
                    **({"gold_paragraphs_left_out": left_out} if left_out else {})})
    report(accelerator, rows, ceiling, left_out,
           f"threshold and weights: {source}; predictions.json at k={answered_k} in {args.output_dir}")
    finish(accelerator)


@dataclass(frozen=True)
class QAArgs(OutputConfig):
    """The script's own flags: what to answer and measure, where the results go (OutputConfig's, shared); the system
    is SystemConfig's and the answer rule's settings are AnswerSettings'."""
    questions: str = arg(None, "Questions to answer: SQuAD v1.1/v2.0 JSON (with answers the system is measured), "
                               "JSON lines of {id, question} (optionally context and answers {text, answer_start}), "
                               "or labelled by answer strings without a paragraph: JSON lines of {id, question, "
                               "answers: [str, ...]} ([] for no answer) or DPR's question<TAB>[answers] .csv/.tsv "
                               "(ids: line numbers), measured on the strings. Every question needs an id.")
    validation_file: Optional[str] = arg(None, "Labelled questions (any labelled layout of --questions) to tune the "
                                               "system's no-answer threshold and weights on, for each number of "
                                               "passages read (instead of --no_answer_threshold; each weight too "
                                               "unless given): the weight cross-fitted over two folds of its whole "
                                               "articles (of its questions where they name no title or paragraph), "
                                               "the threshold on all of it.")
    eval_k: list[int] = field(default_factory=lambda: [1, 3, 5, 10], metadata={
        "help": "The numbers of passages read that the measurement reports (one retrieval, one reading, at the "
                "largest; at most the corpus).", "nargs": "+"})
    max_questions: Optional[int] = arg(None, "Answer the first N questions only (quick runs).")
    output_dir: str = arg("outputs/qa", "Where predictions.json, details.jsonl and eval_results.json go.")
    process_group_timeout: int = process_group_timeout_arg()  # an index built from --passages: BM25 by one process

    def __post_init__(self):
        if not self.questions:
            raise UserError("give --questions (and --retriever, --reader, the corpus)")
        check_input_files(self, "questions", "validation_file")


FLAGS = (QAArgs, SystemConfig, AnswerSettings)


def resolve(args: QAArgs, config: SystemConfig, answer_settings: AnswerSettings):
    """The checks across the parsed configs, once (after the system's, as the corpus and models are what a run is
    about), and the k's in order."""
    # the calibration is fitted here when the threshold is tuned on --validation_file
    answer_settings.check(fits_calibration=args.validation_file is not None
                          and answer_settings.no_answer_threshold is None)
    check_at_least_one(args, "max_questions", "process_group_timeout")
    if min(args.eval_k) < 1:
        raise UserError(f"--eval_k must be at least 1 (got {min(args.eval_k)})")
    out = os.path.realpath(args.output_dir)
    for name, path in (("reader", config.reader), ("retriever", config.retriever), ("index", config.index),
                       ("questions", args.questions), ("passages", config.passages),
                       ("validation_file", args.validation_file)):
        if path and path != "bm25" and (os.path.realpath(path) + os.sep).startswith(out + os.sep):
            raise UserError(f"--output_dir {args.output_dir} holds --{name} {path}: give another --output_dir")
    return replace(args, eval_k=sorted(set(args.eval_k))), config, answer_settings


if __name__ == "__main__":
    main()
