"""Folds of whole articles, for the choices cross-validated over articles: the QA system's retriever weight
(qa_system.py --validation_file), the reader's epochs (scripts/article_folds.py) and the scores of a threshold tuned
on other articles (benchmarks/qa_crossfit.py). An article's questions share its wording, its paragraphs and its
share of unanswerable questions, so a choice tuned on some of its questions and scored on others looks better than
it will on a user's articles; folds that keep each article whole score it only on articles it never saw. A question
with neither a title nor a paragraph (answer strings without a paragraph: DPR's NQ and TriviaQA files) names no
article, so it is an article of its own: its folds are folds of questions, each question scored only by settings
tuned on other questions (which is sound where questions are independent, as in those files; questions written
about one document share its wording, and a "title" on each keeps them whole)."""

from utils.errors import UserError
from utils.files.squad import is_impossible


def article_of(example: dict) -> str:
    """The article of an example or question in the flat layout (utils.files.squad): its title, or where a flattened
    row has none, its paragraph (a paragraph is one article's); for a question with neither, its id (an article of
    its own)."""
    return example["title"] or example["context"] or f"question {example['id']}"


def fold_unit(examples: list[dict]) -> str:
    """What the folds of these examples keep whole, as the outputs name it: "articles", "questions" (no question
    names an article), or both."""
    named = [bool(ex["title"] or ex["context"]) for ex in examples]
    return "articles" if all(named) else "questions" if not any(named) else \
        "articles (a question without a title or paragraph its own)"


def articles_of(examples: list[dict]) -> dict[str, list[dict]]:
    """The examples of each article (article_of), articles and examples in file order."""
    articles = {}
    for ex in examples:
        articles.setdefault(article_of(ex), []).append(ex)
    return articles


def article_folds(questions: list[dict], folds: int = 2) -> list[list[dict]]:
    """`folds` lists of labelled questions (utils.files.squad: the flat layout), each article (article_of) whole in
    one, the folds as even as whole articles allow in both their number of questions and their number of unanswerable
    ones (so in their share of them too: a cross-fitted score then measures other articles, not another share of
    unanswerable questions). Articles are dealt largest first, each to the fold it evens out most, then moved or
    swapped between folds while that evens them out more (`_imbalance`); every step is deterministic, ties going to
    the earlier fold and article. Each fold lists its articles in file order. Fewer articles than folds is a
    UserError: a fold would be empty."""
    articles = list(articles_of(questions).values())
    if len(articles) < folds:
        raise UserError(f"{len(articles)} article(s): {folds} folds of whole articles need at least {folds}")
    sizes = [(len(a), sum(map(is_impossible, a))) for a in articles]
    where = [-1] * len(articles)
    totals = [[0, 0] for _ in range(folds)]

    def place(i, f):
        if where[i] >= 0:
            totals[where[i]][0] -= sizes[i][0]
            totals[where[i]][1] -= sizes[i][1]
        where[i] = f
        totals[f][0] += sizes[i][0]
        totals[f][1] += sizes[i][1]

    overall = [sum(n for n, _ in sizes), sum(u for _, u in sizes)]
    for i in sorted(range(len(articles)), key=lambda i: (-sizes[i][0], -sizes[i][1], i)):
        best = None
        for f in range(folds):
            place(i, f)
            cost = _imbalance(totals, overall, where)
            if best is None or cost < best[0]:
                best = (cost, f)
        place(i, best[1])
    _even_out(sizes, where, totals, overall, place)
    out = [[] for _ in range(folds)]
    for i, article in enumerate(articles):
        out[where[i]].extend(article)
    return out


def _imbalance(totals: list[list[int]], overall: list[int], where: list[int]) -> float:
    """How far the folds are from even: the squared deviations of each fold's share of the questions and of the
    unanswerable questions from 1/folds; once every article is placed (`where` has no -1), an empty fold is worst."""
    folds = len(totals)
    if -1 not in where and len(set(where)) < folds:
        return float("inf")
    cost = 0.0
    for n, u in totals:
        cost += (n / overall[0] - 1 / folds) ** 2
        if overall[1]:
            cost += (u / overall[1] - 1 / folds) ** 2
    return cost


def _even_out(sizes, where, totals, overall, place, passes: int = 20) -> None:
    """Move single articles to another fold, then swap pairs between folds, while that lowers `_imbalance`. A move
    changes the folds' totals by what it moves, not by which article: one that failed is not tried again for another
    article of the same size and fold until a move succeeds (the same folds, without trying every pair of many
    articles of one question each)."""
    folds, count = len(totals), len(sizes)
    cost = [_imbalance(totals, overall, where)]
    failed = set()  # what the moves tried since the last that succeeded did, in sizes and folds

    def attempt(moves: list[tuple[int, int]]) -> bool:  # (article, fold) moves, kept only if the folds even out
        effect = tuple((sizes[i], where[i], f) for i, f in moves)
        if effect in failed:
            return False
        before = [(i, where[i]) for i, _ in moves]
        for i, f in moves:
            place(i, f)
        new = _imbalance(totals, overall, where)
        if new < cost[0] - 1e-12:
            cost[0] = new
            failed.clear()
            return True
        for i, f in reversed(before):
            place(i, f)
        failed.add(effect)
        return False

    for _ in range(passes):
        improved = False
        for i in range(count):
            for f in range(folds):
                if f != where[i]:
                    improved |= attempt([(i, f)])
        for i in range(count if count <= 2000 else 0):  # pairs: quadratic, worth it for the article counts of QA sets
            for j in range(i + 1, count):
                if where[i] != where[j]:
                    improved |= attempt([(i, where[j]), (j, where[i])])
        if not improved:
            return


def cross_fit_folds(questions: list[dict]) -> list[list[dict]] | None:
    """Labelled questions in two folds of whole articles (article_folds), or None where they hold one article (a
    SQuAD file of one title, or of one paragraph without a title): nothing to cross-fit over. Questions without a
    title or paragraph are each an article (article_of)."""
    return article_folds(questions, 2) if len(articles_of(questions)) >= 2 else None
