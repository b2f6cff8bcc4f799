"""Export the labels users gave the served answers (serve.py's feedback store) as training data.

Runbook (from the repository root, after `pip install -r requirements.txt`):

  python export_feedback.py --feedback_db feedback.sqlite --output_dir outputs/feedback
      Reads every label of the store (a SQLite file serve.py wrote, or the SQLAlchemy URL of a shared PostgreSQL
      database; nothing in it is written) and writes, all at once or not at all (a new directory swapped in whole):
        squad.json       SQuAD v2.0: a selected or confirmed answer at its span in its passage as read; a question no
                         passage shown answers (no_answer, or an abstention marked right) is_impossible in the
                         passage its answer came from, else the first shown: a label is one question. For the
                         reader: train_reader.py --train_file squad.json.
        questions.jsonl  {"id", "question", "answers": [...] ([] unanswerable), "title"}: the labelled questions
                         qa_system.py --questions and --validation_file read (measured, or tuned on).
        dpr.json         DPR: the labelled passage the positive, the passages shown without the answer the hard
                         negatives; unanswerable questions skipped. For the retriever: train_dpr.py --train_file.
        export.json      the rule and what it decided: rows read, "wrong" rows (counted, no label), malformed rows
                         (their ids and why), labels superseded by a later label of their question, answerable and
                         unanswerable questions, each file's counts, the highest label id exported.
      A "wrong" without a correction is no label. A question labelled twice: its latest label wins (questions
      compared after Unicode NFC, whitespace collapsed and case folded), and a later "wrong" replaces nothing
      (utils/feedback/export.py says each rule).

  python export_feedback.py --feedback_db postgresql+psycopg://qa@db/labels --output_dir outputs/feedback \
      --overwrite_output_dir
      A later export over an earlier one (the store only grows): without --overwrite_output_dir an output directory
      that holds anything is refused, as every script's (utils/runtime/output_dir.py).

Refused in one line, before anything is written: a --feedback_db file that does not exist, is not a database or
holds no feedback labels (its table is not there: not a store serve.py wrote); a store with no label to export (an
empty one, or only "wrong" and malformed rows); an --output_dir that holds anything (without
--overwrite_output_dir) or that holds the store itself.
"""

import os
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError

from utils.errors import UserError, exit_on_user_error
from utils.feedback.export import export
from utils.feedback.store import FeedbackDB, FeedbackStore, displayed, one_line
from utils.files.jsonfiles import write_json_file, write_json_lines
from utils.runtime.flags import arg, parse_args
from utils.runtime.output_dir import ONE_PROCESS, OutputConfig, prepare_output_dir, publish_dir

@dataclass(frozen=True)
class ExportArgs(FeedbackDB, OutputConfig):
    """The store to read (FeedbackDB: serve.py's --feedback_db) and where the training data goes (OutputConfig's
    --output_dir, --overwrite_output_dir)."""
    output_dir: str = arg(None, "Where squad.json, questions.jsonl, dpr.json and export.json go (a new or empty "
                                "directory, or --overwrite_output_dir).")


FLAGS = (ExportArgs,)


def resolve(args: ExportArgs) -> ExportArgs:
    """The checks, once, before anything is read or written: the store is a file that exists (or a URL), not inside
    the output directory (which --overwrite_output_dir would replace whole), and the output directory may be used."""
    if not args.output_dir:
        raise UserError("give --output_dir (where the training data goes)")
    if "://" not in args.feedback_db:
        out, db = os.path.realpath(args.output_dir), os.path.realpath(args.feedback_db)
        if os.path.commonpath([out, db]) == out:
            raise UserError(f"--output_dir {args.output_dir}: holds the --feedback_db {args.feedback_db}: give "
                            "another directory (the export replaces its contents)")
    prepare_output_dir(ONE_PROCESS, args.output_dir, "evaluate", overwrite=args.overwrite_output_dir)
    return args


@exit_on_user_error
def main(argv=None):
    (args,) = parse_args(FLAGS, argv)
    args = resolve(args)
    store = FeedbackStore(args.feedback_db, create=False)  # only read: nothing is created in it
    try:
        squad, questions, dpr, summary = export(store)
    except SQLAlchemyError as err:
        raise UserError(f"--feedback_db {args.feedback_db}: cannot read it ({one_line(err)})") from None
    finally:
        store.close()
    counts = summary["counts"]
    if not questions:  # an empty export would be files no loader takes: said instead
        raise UserError(f"--feedback_db {args.feedback_db}: nothing to export: " + (
            "it holds no labels" if not counts["rows"] else
            f"none of its {counts['rows']} rows is a label ({counts['wrong_not_labels']} 'wrong', which is no "
            f"label; {counts['malformed']} malformed)"))
    with publish_dir(ONE_PROCESS, args.output_dir, state="evaluated") as out:  # all four files, or none
        write_json_file(os.path.join(out, "squad.json"), squad)
        write_json_lines(os.path.join(out, "questions.jsonl"), questions)
        write_json_file(os.path.join(out, "dpr.json"), dpr)
        write_json_file(os.path.join(out, "export.json"), {"feedback_db": displayed(args.feedback_db), **summary})
    print(f"{args.output_dir}: {len(questions)} questions ({counts['answerable']} answerable, "
          f"{counts['unanswerable']} unanswerable) from {counts['rows']} rows up to label {counts['last_label_id']} "
          f"(superseded by a later label of their question: {counts['superseded']}; 'wrong', no label: "
          f"{counts['wrong_not_labels']}; malformed: {counts['malformed']}); squad.json "
          f"{summary['squad']['questions']} examples, dpr.json {summary['dpr']['questions']} questions "
          f"({summary['dpr']['skipped_unanswerable']} unanswerable skipped)")


if __name__ == "__main__":
    main()
