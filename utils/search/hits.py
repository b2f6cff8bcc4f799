"""A search's results as every API returns them: k checked, and each hit a passage of the corpus with its score and,
where the corpus gives it, where it came from (its document, its place there, its page)."""

import numpy as np

from utils.errors import UserError
from utils.files.corpus import SOURCE_FIELDS


def check_k(k) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise UserError(f"k must be a whole number of at least 1 (got {k!r})")


def passage_hit(passages, j: int, score) -> dict:
    """Passage j of the corpus as a search result: {"passage_id", "title", "text", "score", "position" (j: its place
    in the corpus)}, and "source" ({"document", "passage", "page"}, those it has: where an ingested passage came
    from) where the corpus gives it."""
    p = passages[j]
    source = {k: p[k] for k in SOURCE_FIELDS if k in p}
    return {"passage_id": p["passage_id"], "title": p["title"], "text": p["text"], "score": float(score),
            "position": int(j), **({"source": source} if source else {})}


def ranked_passages(passages, scores, ids) -> list[list[dict]]:
    """Per query, its ranked passage ids (-1: none) and scores as search results, best first."""
    return [[passage_hit(passages, int(j), s) for s, j in zip(row_s, row_i) if j >= 0]
            for row_s, row_i in zip(scores, ids)]
