"""Numeric helpers with one definition for the whole project: the log-sum-exp that the reader's decoding
(utils.reader.decoding) and the QA system's answer rule (utils.system.answer) both take over logits and scores."""

import math

import numpy as np


def logsumexp(values) -> float:
    """log(sum(exp(v) for v in values)), in float64 whatever the values' dtype: -inf when there are no values or all
    are -inf (the log of a probability of zero), +inf when one is +inf. `values`: an array or any iterable of
    numbers."""
    x = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.float64)
    # pairwise log(exp(a) + exp(b)), stable for any magnitudes and exact on infinities (no inf - inf)
    return float(np.logaddexp.reduce(x)) if x.size else -math.inf
