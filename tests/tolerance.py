"""What a test may demand of two results computed in different summation orders: the same ranking up to near-ties.

The code promises bit-equality only where it computes the same thing the same way (a resumed run, 2 processes = 1,
an index read back from disk). Elsewhere (one padded batch against length buckets, numpy's full matrix against the
blockwise search, a question asked alone against it batched with others) scores agree to float rounding, and which
CPU kernels run (AMX, AVX-512) moves their last bits: two passages or spans whose scores are that close may come in
either order. These checks count scores within `rel` of the row's largest magnitude as tied, and demand everything
else exactly: the same ids, in the same order, with the same scores, wherever no near-tie decides.
"""

import numpy as np

REL = 1e-6  # 8 float32 ulps of the largest score; measured: a padded batch and one text at a time differ by <4e-7


def _eps(values, rel: float) -> float:
    finite = [abs(v) for v in values if v is not None and np.isfinite(v)]
    return rel * max(finite + [1.0])


def assert_ranked_alike(got, want, rel: float = REL) -> None:
    """`got`, `want`: per question a ranked list of (id, score), best first, from two computations. Each id both
    lists hold has the same score in both (within the tolerance); the sorted scores agree position by position (so
    the two orders differ only among near-equal scores); an id only one list holds scores within the tolerance of
    the other list's last score (a near-tie at the cut)."""
    assert len(got) == len(want), (len(got), len(want))
    for q, (a, b) in enumerate(zip(got, want)):
        assert len(a) == len(b), (q, a, b)
        eps = _eps([s for _, s in a] + [s for _, s in b], rel)
        sa, sb = dict(a), dict(b)
        for ident in sa.keys() & sb.keys():
            assert abs(sa[ident] - sb[ident]) <= eps, (q, ident, sa[ident], sb[ident])
        for x, y in zip(sorted(sa.values(), reverse=True), sorted(sb.values(), reverse=True)):
            assert abs(x - y) <= eps, (q, x, y)
        for ident in sa.keys() ^ sb.keys():
            other = b if ident in sa else a
            score = sa[ident] if ident in sa else sb[ident]
            assert abs(score - other[-1][1]) <= eps, (q, ident, "not a near-tie at the cut", score, other[-1])


def assert_top_k_of(ids, scores, rel: float = REL) -> None:
    """`ids[i]` is a best-first top k of row i of the reference matrix `scores` (another computation's), near-ties
    aside: distinct, in non-increasing reference order, and no passage left out scores above the last one taken."""
    scores = np.asarray(scores, dtype=np.float64)
    for i, row in enumerate(np.asarray(ids)):
        ref = scores[i]
        eps = _eps(ref, rel)
        taken = ref[row]
        assert len(set(row.tolist())) == len(row), (i, row)
        assert np.all(np.diff(taken) <= eps), (i, row, taken)
        rest = np.delete(ref, row)
        assert not len(rest) or rest.max() <= taken.min() + eps, (i, rest.max(), taken.min())


def assert_ranks_within(got, scores, gold, rel: float = REL) -> int:
    """`got[i]`: the rank of question i's best gold passage by another computation of `scores` (the one rank rule:
    1 + the other passages scoring at least as high). Demanded: between the rank counting only passages clearly
    above it and the rank counting every passage within the tolerance of it as at or above. Returns the mean width
    of those bands (a caller checks that the tolerance left the ranks nearly decided)."""
    scores = np.asarray(scores, dtype=np.float64)
    width = 0
    for i, (rank, idx) in enumerate(zip(got, gold)):
        idx = list(dict.fromkeys(idx))
        row = scores[i]
        eps = _eps(row, rel)
        best = row[idx].max()
        others = np.delete(row, idx)
        low, high = 1 + int((others > best + eps).sum()), 1 + int((others >= best - eps).sum())
        assert low <= rank <= high, (i, rank, low, high)
        width += high - low
    return width / max(len(got), 1)


def assert_answered_alike(got: dict, want: dict, threshold: float | None = None, rel: float = 10 * REL) -> None:
    """Two answers of one question from two computations ({"answer", "passage_id", "score", "null_minus_best"}):
    the same answer from the same passage with the same score, unless a near-tie decided: two answers whose scores
    are within the tolerance, or (at `threshold`, the system's no-answer cut) an answer against an abstention whose
    null-minus-best ratios both sit at the cut. Answers pass through more arithmetic than a score (log-sum-exps,
    weights): a looser tolerance."""
    eps = _eps([got.get("score"), want.get("score"), got.get("null_minus_best"), want.get("null_minus_best")], rel)
    same = (got["answer"] or None) == (want["answer"] or None) and got["passage_id"] == want["passage_id"]
    if same:
        if got.get("score") is not None and want.get("score") is not None:
            assert abs(got["score"] - want["score"]) <= eps, (got["score"], want["score"])
        return
    if bool(got["answer"]) != bool(want["answer"]):  # one abstained: only a question at the cut may
        assert threshold is not None, ("an answer against an abstention", got, want)
        assert all(abs(x["null_minus_best"] - threshold) <= eps for x in (got, want)), (
            "an answer against an abstention, not at the cut", threshold, got, want)
        return
    assert abs(got["score"] - want["score"]) <= eps, ("different answers, not a near-tie", got, want)


def assert_predictions_alike(got: list[dict], want: list[dict], threshold: float | None = None) -> int:
    """`assert_answered_alike` question by question (the same questions, in the same order). Returns how many
    answers a near-tie changed."""
    assert [x.get("id") for x in got] == [x.get("id") for x in want]
    for x, y in zip(got, want):
        assert_answered_alike(x, y, threshold)
    return sum((x["answer"] or None, x["passage_id"]) != (y["answer"] or None, y["passage_id"])
               for x, y in zip(got, want))
