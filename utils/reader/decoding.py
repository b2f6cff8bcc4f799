"""Span decoding: the windows' start/end logits -> each example's best answer span (n-best search over all its
windows), its null score, and the SQuAD v2 rule (`abstains`) that turns them into an answer or "". A reader trained
with shared normalization (utils.reader.shared_norm) is decoded as it was trained.
"""

from collections import defaultdict

import numpy as np
from tqdm.auto import tqdm

from utils.numeric import logsumexp

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def decode_spans(example_ids, windows_example_ids, windows_offsets, start_logits, end_logits,
                 n_best_size=20, max_answer_length=30, contexts=None, shared_norm: bool = False):
    """Return {example_id: {"text", "score", "null_score", "null_minus_best", "nbest", and the log-sum-exps
    "null_start"/"null_end", "lse_start"/"lse_end", "context_start"/"context_end"}} for every example id.

    windows_* are aligned with the rows of start_logits/end_logits (float arrays, one row per window, possibly of
    different lengths); contexts maps example id -> context string. "nbest" lists the `n_best_size` best distinct
    spans (at most `max_answer_length` tokens) over all windows, best first, as {"text", "score", "start", "end"}
    (character offsets into the context); "text"/"score" are its first entry. `shared_norm`: score spans and the null
    as a shared-normalization reader was trained.
    """
    windows = defaultdict(list)
    for f, ex_id in enumerate(windows_example_ids):
        windows[ex_id].append(f)
    results = {}
    for ex_id in example_ids:
        spans, null_score = {}, np.inf  # (start char, end char) -> best score of that span over the windows
        cls_s, cls_e, all_s, all_e, ctx_s, ctx_e, read = [], [], [], [], [], [], []
        for f in windows[ex_id]:
            starts, ends, offsets = np.asarray(start_logits[f]), np.asarray(end_logits[f]), windows_offsets[f]
            n = min(len(offsets), len(starts))
            context = np.array([o is not None for o in offsets[:n]], dtype=bool)  # the tokens a span may take
            tokens = np.flatnonzero(context)
            if shared_norm:
                read.append((starts, ends, *_token_at(offsets, tokens)))
            # The lowest [CLS] score: the window most sure there is an answer.
            null_score = min(null_score, float(starts[0] + ends[0]))
            cls_s.append(starts[0])
            cls_e.append(ends[0])
            all_s.append(logsumexp(np.append(starts[0], starts[tokens])))
            all_e.append(logsumexp(np.append(ends[0], ends[tokens])))
            # Over the context tokens alone: a passage's share of the answer, exact even where the no-answer holds
            # nearly all the mass (which lse minus null is not).
            ctx_s.append(logsumexp(starts[tokens]))
            ctx_e.append(logsumexp(ends[tokens]))
            # Every pair of the n best starts and ends at once; the spans a window allows are kept at their best score.
            top_starts = np.argsort(starts[:n])[::-1][:n_best_size]
            top_ends = np.argsort(ends[:n])[::-1][:n_best_size]
            s, e = top_starts[:, None], top_ends[None, :]
            kept = context[s] & context[e] & (e >= s) & (e - s + 1 <= max_answer_length)
            rows, columns = np.nonzero(kept)  # row-major: the order the pairs were once looped in
            s, e = top_starts[rows], top_ends[columns]
            for a, b, score in zip(s.tolist(), e.tolist(), (starts[s] + ends[e]).tolist()):
                span = (offsets[a][0], offsets[b][1])
                if score > spans.get(span, -np.inf):
                    spans[span] = score
        # The shared-normalization loss sums a span's start (and end) probability over every window holding it, so
        # its score is the log-sum-exp over those windows; its best window alone would tilt a passage longer than a
        # window towards abstaining by up to twice the log of its number of windows.
        if shared_norm:  # each candidate scored over every window that holds it, as the loss sums it
            spans = {span: _summed_over_windows(span, read) for span in spans}
        # Best first; among equal scores the earlier span.
        best = sorted(spans.items(), key=lambda item: (-item[1], item[0]))[:n_best_size]
        nbest = [{"text": contexts[ex_id][a:b], "score": score, "start": a, "end": b} for (a, b), score in best]
        top = nbest[0] if nbest else {"text": "", "score": -np.inf}
        stats = {"null_start": logsumexp(cls_s), "null_end": logsumexp(cls_e), "lse_start": logsumexp(all_s),
                 "lse_end": logsumexp(all_e), "context_start": logsumexp(ctx_s), "context_end": logsumexp(ctx_e)}
        if shared_norm:
            # The no-answer is summed over every window's [CLS], as the loss sums it: null_minus_best is then the log
            # ratio of the no-answer's probability to the best span's.
            null_score = stats["null_start"] + stats["null_end"]
        results[ex_id] = {"text": top["text"], "score": top["score"], "null_score": null_score,
                          "null_minus_best": null_score - top["score"] if nbest else np.inf, "nbest": nbest, **stats}
    return results


def _token_at(offsets, tokens) -> tuple[dict, dict]:
    """A window's context tokens (`tokens`, in order) by the character a span starts at and by the one it ends at."""
    # The tokens the training labels take (utils.reader.windows.prepare_windows) where characters are shared.
    tokens = tokens.tolist()
    start_at = dict(zip((offsets[k][0] for k in tokens), tokens))  # the last token of each start wins
    end_at = dict(zip((offsets[k][1] for k in reversed(tokens)), reversed(tokens)))  # the first of each end wins
    return start_at, end_at


def _summed_over_windows(span, read) -> float:
    """A shared-normalization reader's score of a span: the log-sum-exp of its start logits over the windows that
    hold it whole plus that of its end logits (`read`: per window its start and end logits and `_token_at`)."""
    a, b = span
    held = [(starts[start_at[a]], ends[end_at[b]]) for starts, ends, start_at, end_at in read
            if a in start_at and b in end_at and start_at[a] <= end_at[b]]
    if len(held) == 1:  # the log-sum-exp of one value is that value
        return float(held[0][0]) + float(held[0][1])
    return logsumexp(s for s, _ in held) + logsumexp(e for _, e in held)


def abstains(null_minus_best: float, threshold: float | None) -> bool:
    """Whether to abstain: the null score beats the best span by more than `threshold` (a question at the threshold is
    answered); None (a SQuAD v1.1 reader) always answers. The one place the rule is written."""
    # Strictly greater: that is how utils.reader.metrics.best_null_threshold scores the threshold it picks.
    return threshold is not None and null_minus_best > threshold


def apply_null_threshold(decoded: dict, threshold: float | None) -> dict:
    """{id: answer text}, "" where the reader abstains at `threshold` (`abstains`)."""
    return {i: ("" if abstains(d["null_minus_best"], threshold) else d["text"]) for i, d in decoded.items()}


def span_logits(model, loader, gather=None, progress: str | None = None) -> tuple[list, list]:
    """fp32 start and end logits of every window (numpy rows in loader order), whatever precision the forward ran
    in. `gather` collects them across processes (evaluation under DDP); `progress` names a progress bar."""
    starts, ends = [], []
    for batch in tqdm(loader, desc=progress, unit="batch", disable=progress is None, dynamic_ncols=True):
        out = model(**{k: v for k, v in batch.items() if k in MODEL_INPUTS})
        for logits, sink in ((out.start_logits, starts), (out.end_logits, ends)):
            logits = logits.float()
            sink.extend((gather(logits) if gather else logits).cpu().numpy())
    return starts, ends


def decode_examples(examples: list[dict], windows, starts, ends, decoding, shared_norm: bool = False) -> dict:
    """`decode_spans` of `examples`. `windows`: their windows with example_id and offset_mapping; `decoding`: a
    DecodingConfig or ReaderSettings giving n_best_size and max_answer_length."""
    return decode_spans([ex["id"] for ex in examples], windows["example_id"], windows["offset_mapping"],
                        starts, ends, decoding.n_best_size, decoding.max_answer_length,
                        {ex["id"]: ex["context"] for ex in examples}, shared_norm)
