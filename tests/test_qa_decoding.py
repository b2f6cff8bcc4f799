"""n-best span decoding over windows, with hand-built logits."""

import math

import numpy as np

from utils.numeric import logsumexp
from utils.reader.decoding import apply_null_threshold, decode_spans
from utils.system.answer import combine

CONTEXT = "Ada built a loom in 1823 at Dunhallow."
#          0123456789012345678901234567890123456
# Token offsets of a made-up window: [CLS], 2 question tokens, 8 context tokens, [SEP]
OFFSETS = [None, None, None, (0, 3), (4, 9), (10, 11), (12, 16), (17, 19), (20, 24), (25, 27), (28, 38), None]


def logits(peaks, n=len(OFFSETS)):
    x = np.full(n, -5.0)
    for i, v in peaks.items():
        x[i] = v
    return x


def test_best_span_and_null_score():
    start, end = logits({8: 4.0, 0: 1.0}), logits({8: 3.0, 0: 1.5})
    out = decode_spans(["q"], ["q"], [OFFSETS], [start], [end], contexts={"q": CONTEXT})["q"]
    assert out["text"] == "1823" and out["score"] == 7.0
    assert out["null_minus_best"] == 2.5 - 7.0


def test_rejects_reversed_too_long_and_non_context_spans():
    # Highest start is after the highest end, and a question token has the top end logit.
    start, end = logits({9: 5.0, 3: 1.0}), logits({2: 9.0, 4: 4.0, 10: 0.5})
    out = decode_spans(["q"], ["q"], [OFFSETS], [start], [end], contexts={"q": CONTEXT})["q"]
    assert out["text"] == "at Dunhallow."  # 9..10: the best valid pair (3..4 scores 5.0 < 5.5)
    limited = decode_spans(["q"], ["q"], [OFFSETS], [start], [end], max_answer_length=1,
                                 contexts={"q": CONTEXT})["q"]
    # One-token spans only: start 9 + end 9 = 5 - 5 = 0 beats 4..4 (-1) and 10..10 (-4.5).
    assert limited["text"] == "at"


def test_best_window_wins_and_null_is_the_minimum_over_windows():
    w1 = ([logits({4: 2.0, 0: 3.0})], [logits({4: 2.0, 0: 3.0})])
    w2 = ([logits({6: 5.0, 0: 0.0})], [logits({6: 5.0, 0: 1.0})])
    out = decode_spans(["q"], ["q", "q"], [OFFSETS, OFFSETS], w1[0] + w2[0], w1[1] + w2[1],
                             contexts={"q": CONTEXT})["q"]
    assert out["text"] == "loom" and out["null_minus_best"] == 1.0 - 10.0


def test_threshold_turns_confident_null_into_empty_answer():
    decoded = {"a": {"text": "x", "null_minus_best": 0.5}, "b": {"text": "y", "null_minus_best": -0.5}}
    assert apply_null_threshold(decoded, 0.0) == {"a": "", "b": "y"}
    assert apply_null_threshold(decoded, 1.0) == {"a": "x", "b": "y"}


def test_a_log_sum_exp_over_nothing_but_minus_infinity_is_minus_infinity():
    """Logits masked to -inf everywhere (a probability of zero) give log-sum-exps of -inf, not NaN, in the reader's
    decoding and in the QA system's rule, which use the one function."""
    masked = np.full(len(OFFSETS), -np.inf)
    out = decode_spans(["q"], ["q"], [OFFSETS], [masked], [masked], contexts={"q": CONTEXT}, shared_norm=True)["q"]
    assert [out[k] for k in ("null_start", "null_end", "lse_start", "lse_end")] == [-np.inf] * 4
    assert out["text"] == "" and out["null_minus_best"] == np.inf
    reading = {"passage_id": "a", "text": "x", "score": 1.0, "null_score": 0.0, "null_minus_best": -1.0,
               "null_start": -math.inf, "null_end": -math.inf, "lse_start": 0.0, "lse_end": 0.0}
    both = combine([reading, dict(reading, passage_id="b")], shared_norm=True)
    assert both["null_minus_best"] == -math.inf and both["no_answer_probability"] == 0.0
    assert logsumexp([]) == logsumexp(np.full(3, -np.inf, dtype=np.float32)) == -math.inf
    assert logsumexp(iter([-math.inf])) == -math.inf  # any iterable, as the answer rule passes them
    assert logsumexp([0.0, 0.0]) == math.log(2) and logsumexp([1.0, math.inf]) == math.inf


def test_the_n_best_are_every_allowed_pair_ranked_by_score():
    """With n_best_size covering every token, the n-best list is every span a window allows (a context start at or
    before a context end, within max_answer_length tokens) ranked by start + end logit, whichever rule reads it."""
    rng = np.random.default_rng(0)
    start, end = rng.normal(size=len(OFFSETS)).astype(np.float32), rng.normal(size=len(OFFSETS)).astype(np.float32)
    context = [k for k, o in enumerate(OFFSETS) if o is not None]
    pairs = [(s, e) for s in context for e in context if s <= e < s + 4]
    by_hand = sorted(((OFFSETS[s][0], OFFSETS[e][1]), float(start[s]) + float(end[e])) for s, e in pairs)
    by_hand.sort(key=lambda item: -item[1])
    for shared_norm in (False, True):
        out = decode_spans(["q"], ["q"], [OFFSETS], [start], [end], n_best_size=len(OFFSETS), max_answer_length=4,
                           contexts={"q": CONTEXT}, shared_norm=shared_norm)["q"]
        got = [((n["start"], n["end"]), n["score"]) for n in out["nbest"]]
        assert [span for span, _ in got] == [span for span, _ in by_hand[:len(OFFSETS)]]
        assert np.allclose([score for _, score in got], [score for _, score in by_hand[:len(OFFSETS)]],
                           rtol=0, atol=1e-6)
