"""Folds of whole articles, for the choices cross-validated over articles: the QA system's retriever weight
(qa_system.py --validation_file), the reader's epochs (scripts/article_folds.py) and the scores of a threshold tuned
on other articles (benchmarks/qa_crossfit.py). An article's questions share its wording, its paragraphs and its
share of unanswerable questions, so a choice tuned on some of its questions and scored on others looks better than
it will on a user's articles; folds that keep each article whole score it only on articles it never saw."""

from utils.errors import UserError
from utils.files.squad import is_impossible


def article_of(example: dict) -> str:
    """The article of an example or question in the flat layout (utils.files.squad): its title, or where a flattened
    row has none, its paragraph (a paragraph is one article's); "" for a question with neither."""
    return example["title"] or example["context"] or ""


def articles_of(examples: list[dict]) -> dict[str, list[dict]]:
    """The examples of each article (article_of), articles and examples in file order."""
    articles = {}
    for ex in examples:
        articles.setdefault(article_of(ex), []).append(ex)
    return articles


def article_folds(questions: list[dict], folds: int = 2) -> list[list[dict]]:
    """`folds` lists of labelled questions (utils.files.squad: the flat layout), each article (article_of) whole in
    one: first the articles that hold an unanswerable question, then the rest, each in file order to the fold with
    the fewest questions so far (the first on a tie), so that every fold holds both kinds of article where there are
    enough of them. Fewer articles than folds is a UserError: a fold would be empty."""
    articles = articles_of(questions)
    if len(articles) < folds:
        raise UserError(f"{len(articles)} article(s): {folds} folds of whole articles need at least {folds}")
    out = [[] for _ in range(folds)]
    for unanswerable in (True, False):
        for article in articles.values():
            if any(is_impossible(q) for q in article) == unanswerable:
                min(out, key=len).extend(article)
    return out


def cross_fit_folds(questions: list[dict]) -> list[list[dict]] | None:
    """Labelled questions in two folds of whole articles (article_folds), or None where they hold one article (a
    SQuAD file of one title, or of one paragraph without a title): nothing to cross-fit over."""
    return article_folds(questions, 2) if len(articles_of(questions)) >= 2 else None
