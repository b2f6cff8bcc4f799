"""Folds of whole articles (utils.files.folds) and the fold files a recipe is cross-validated on
(scripts/article_folds.py)."""

import json
import os

import pytest
from conftest import SAMPLE, assert_user_error, run_script

from utils.errors import UserError
from utils.files.folds import article_folds, cross_fit_folds
from utils.files.squad import load_squad, squad_document


def questions(*articles):
    """(title, answerable, unanswerable) -> flat labelled questions, in that order."""
    out = []
    for title, answerable, unanswerable in articles:
        for i in range(answerable + unanswerable):
            answers = {"text": ["a"], "answer_start": [0]} if i < answerable else {"text": [], "answer_start": []}
            out.append({"id": f"{title}{i}", "title": title, "context": f"{title} text", "question": "?",
                        "answers": answers})
    return out


def fold_sizes(folds):
    return [(len(f), sum(not q["answers"]["text"] for q in f)) for f in folds]


def test_each_article_goes_whole_to_one_fold_the_folds_even_in_questions_and_unanswerable_ones():
    # the shared dev set's articles, (answerable, unanswerable): dealt by whether an article holds any unanswerable
    # question, the folds came out 795 / 516 questions at 16.9% / 30.0% unanswerable; whole articles allow 620 at 25.0%
    # (D, E) and 691 at 19.4% (A, B, C), the most even split of both (by hand over the 2^5 assignments)
    qs = questions(("A", 268, 0), ("B", 191, 0), ("C", 295, 0), ("D", 98, 134), ("E", 170, 155))
    folds = article_folds(qs, 2)
    assert sorted(fold_sizes(folds)) == [(620, 155), (691, 134)]
    titles = [{q["title"] for q in fold} for fold in folds]
    assert sorted(map(sorted, titles)) == [["A", "B", "D"], ["C", "E"]]
    for fold in folds:  # whole articles, in file order
        assert [q["id"] for q in fold] == [q["id"] for q in qs if q["title"] in {x["title"] for x in fold}]
    assert cross_fit_folds(qs) == folds
    # three folds where three articles hold unanswerable questions: one in each, not two in one and none in another
    three = article_folds(questions(("A", 50, 0), ("B", 40, 0), ("C", 45, 0), ("D", 5, 20), ("E", 10, 20),
                                    ("F", 30, 20)), 3)
    assert all(u == 20 for _, u in fold_sizes(three))
    assert cross_fit_folds(questions(("T1", 2, 2))) is None  # one article: nothing to cross-fit over
    with pytest.raises(UserError, match=r"1 article\(s\): 2 folds of whole articles need at least 2"):
        article_folds(questions(("T1", 2, 2)), 2)


def test_a_squad_document_reads_back_as_the_same_questions(tmp_path):
    examples, _ = load_squad(f"{SAMPLE}/train.json")
    path = tmp_path / "again.json"
    path.write_text(json.dumps(squad_document(examples)))
    assert load_squad(str(path)) == (examples, 0)


def test_the_fold_files_train_on_the_other_articles_with_their_passages_only(tmp_path):
    out = tmp_path / "folds"
    proc = run_script("scripts/article_folds.py", f"{SAMPLE}/train.json", "--folds", 3,
                      "--passages", f"{SAMPLE}/dpr_passages.jsonl", "--output_dir", out)
    examples, _ = load_squad(f"{SAMPLE}/train.json")
    folds = article_folds(examples, 3)
    corpus = [json.loads(line) for line in open(f"{SAMPLE}/dpr_passages.jsonl")]
    for i, fold in enumerate(folds):
        held, _ = load_squad(str(out / f"fold{i}-heldout.json"))
        train, _ = load_squad(str(out / f"fold{i}-train.json"))
        assert held == fold and train == [q for j, f in enumerate(folds) if j != i for q in f]
        titles = {q["title"].replace("_", " ") for q in train}
        passages = json.load(open(out / f"fold{i}-passages.json"))
        assert passages and all(p["title"].replace("_", " ") in titles for p in passages)
        assert len(passages) == sum(p["title"].replace("_", " ") in titles for p in corpus)
        assert f"fold {i}: held out" in proc.stdout
    # a directory that holds anything is refused, and what it holds is left as it was
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    proc = run_script("scripts/article_folds.py", f"{SAMPLE}/train.json", "--output_dir", tmp_path / "mine",
                      check=False)
    assert_user_error(proc, "exists and is not an empty directory")
    assert os.listdir(tmp_path / "mine") == ["notes.txt"]
    proc = run_script("scripts/article_folds.py", f"{SAMPLE}/train.json", "--folds", 1, "--output_dir",
                      tmp_path / "one", check=False)
    assert_user_error(proc, "--folds must be at least 2")
    assert not (tmp_path / "one").exists()


def test_passages_that_cannot_be_matched_to_their_article_by_title_are_refused(tmp_path):
    """Untitled articles would match every untitled passage, held-out paragraphs included (a leak); an article whose
    paragraphs sit in the corpus under its title only in part (some under another spelling of it, say) would lose the
    rest silently. Both are one-line errors, and nothing is written."""
    document = json.load(open(f"{SAMPLE}/train.json"))
    corpus = [json.loads(line) for line in open(f"{SAMPLE}/dpr_passages.jsonl")]
    untitled = tmp_path / "untitled.json"
    untitled.write_text(json.dumps({**document, "data": [{**document["data"][0], "title": ""}, *document["data"][1:]]}))
    proc = run_script("scripts/article_folds.py", untitled, "--passages", f"{SAMPLE}/dpr_passages.jsonl",
                      "--output_dir", tmp_path / "a", check=False)
    assert_user_error(proc, "has no title: its passages cannot be told from a held-out article's")
    title = document["data"][1]["title"]
    renamed = tmp_path / "renamed.jsonl"  # one of its paragraphs under another spelling of its title
    first = next(i for i, p in enumerate(corpus) if p["title"] == title)
    renamed.write_text("".join(json.dumps({**p, "title": title.upper()} if i == first else p) + "\n"
                               for i, p in enumerate(corpus)))
    proc = run_script("scripts/article_folds.py", f"{SAMPLE}/train.json", "--passages", renamed, "--output_dir",
                      tmp_path / "b", check=False)
    paragraphs = len(document["data"][1]["paragraphs"])
    assert_user_error(proc, f"article {title!r}: {paragraphs - 1} of its {paragraphs} paragraphs are passages under "
                            "its title")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
