"""Split SQuAD-format training data into folds of whole articles: to cross-validate a reader recipe's choices (its
number of epochs) over articles instead of choosing them on one dev set.

    python scripts/article_folds.py outputs/squad_train_all.json --folds 2 \
        --passages outputs/train_all_passages.jsonl --output_dir outputs/folds

For each fold i, --output_dir gets fold{i}-train.json (the other folds' articles: train on them), fold{i}-heldout.json
(fold i's articles: give it as --validation_file) and, with --passages, fold{i}-passages.json (the corpus's passages
of the training articles, matched by title with "_" read as a space, as SQuAD and its Wikipedia paragraphs spell
them): the reader's negative or retrieved passages come from there, so no held-out paragraph is read in training.
Matching by title needs every article titled and each article's paragraphs in the corpus under its title (all of
them, or none): otherwise it is refused, since a paragraph under another title would be lost from its fold's corpus
or, held out, read in training.
The folds are utils.files.folds's; the recipe and how to read each fold's scores per epoch: docs/READER.md.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from utils.errors import UserError, exit_on_user_error  # noqa: E402
from utils.files.corpus import load_passages  # noqa: E402
from utils.files.folds import article_folds, articles_of  # noqa: E402
from utils.files.jsonfiles import write_json_file  # noqa: E402
from utils.files.squad import is_impossible, load_squad, squad_document  # noqa: E402


def corpus_title(title: str) -> str:
    """A title as the SQuAD file and the corpus both spell it ("Super_Bowl_50", "Super Bowl 50")."""
    return title.replace("_", " ").strip()


def check_matchable(squad_file: str, passages_file: str, questions: list[dict], passages: list[dict]) -> None:
    """Each article's passages can be told by its title: refused (one line) where an article has no title (it would
    match every untitled passage, held-out paragraphs included), or where only some of the corpus passages that
    hold its paragraphs carry its title (the others would be left out of its fold's corpus, or, held out, kept in
    the other's)."""
    for q in questions:
        if not corpus_title(q["title"] or ""):
            raise UserError(f"{squad_file}: question {q['id']!r} has no title: its passages cannot be told from a "
                            "held-out article's by title; give every article a title")
    titles_of_text = {}
    for p in passages:
        titles_of_text.setdefault(p["text"].strip(), set()).add(corpus_title(p["title"]))
    for title, article in articles_of(questions).items():
        paragraphs = {q["context"].strip() for q in article}
        found = [t for t in paragraphs if t in titles_of_text]
        under = [t for t in found if corpus_title(title) in titles_of_text[t]]
        if found and len(under) < len(paragraphs):
            raise UserError(f"--passages {passages_file}: article {title!r}: {len(under)} of its {len(paragraphs)} "
                            "paragraphs are passages under its title (the rest are elsewhere or under another title): "
                            "give the corpus every paragraph of an article under the article's title")


@exit_on_user_error
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("squad_file", help="labelled SQuAD v1.1/v2.0 JSON (or flattened) training data")
    parser.add_argument("--folds", type=int, default=2, help="the number of folds (at least 2)")
    parser.add_argument("--passages", help="the corpus (JSON lines) the recipe's --passages is: split with the folds")
    parser.add_argument("--output_dir", required=True, help="a new (or empty) directory for the fold files")
    args = parser.parse_args(argv)

    if args.folds < 2:
        raise UserError(f"--folds must be at least 2 (got {args.folds}): one fold leaves nothing held out")
    if os.path.exists(args.output_dir) and (not os.path.isdir(args.output_dir) or os.listdir(args.output_dir)):
        raise UserError(f"--output_dir {args.output_dir}: exists and is not an empty directory; give a new one")
    questions, _ = load_squad(args.squad_file)
    folds = article_folds(questions, args.folds)
    passages = load_passages(args.passages) if args.passages else None
    if passages is not None:
        check_matchable(args.squad_file, args.passages, questions, passages)
    written = []
    for i, held_out in enumerate(folds):
        train = [q for j, fold in enumerate(folds) if j != i for q in fold]
        files = {f"fold{i}-train.json": squad_document(train), f"fold{i}-heldout.json": squad_document(held_out)}
        if passages is not None:
            titles = {corpus_title(q["title"]) for q in train}
            files[f"fold{i}-passages.json"] = [p for p in passages if corpus_title(p["title"]) in titles]
            if not files[f"fold{i}-passages.json"]:
                raise UserError(f"--passages {args.passages}: no passage has the title of a training article of fold "
                                f"{i} (e.g. {sorted(titles)[0]!r})")
        written.append(files)
    # checked and built whole before anything is written: a refusal leaves no fold files behind
    os.makedirs(args.output_dir, exist_ok=True)
    for i, files in enumerate(written):
        for name, document in files.items():
            write_json_file(os.path.join(args.output_dir, name), document)
        held = articles_of(folds[i])
        print(f"fold {i}: held out {len(held)} articles, {len(folds[i])} questions "
              f"({sum(map(is_impossible, folds[i]))} unanswerable); train on "
              f"{len(questions) - len(folds[i])} questions"
              + (f", {len(files[f'fold{i}-passages.json'])} passages" if passages is not None else ""))


if __name__ == "__main__":
    main()
