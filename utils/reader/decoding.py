"""Span decoding: the windows' start/end logits -> each example's best answer span (n-best search), its null score,
and the SQuAD v2 rule that turns them into an answer or "".

For each example the best non-null span is searched across every window: the top `n_best_size` start and end
positions of each window are paired, spans outside the context, reversed, or longer than `max_answer_length` tokens
are dropped, and the highest start+end logit sum wins (for a shared-normalization reader, see below). The null score
is the lowest [CLS] start+end logit over the windows (the window most sure there is an answer). `null_minus_best` =
null score - best span score is what the SQuAD v2 threshold compares: predict no answer when it exceeds the threshold
(0 by default; tuned on dev by utils.reader.metrics).

A reader trained with shared normalization (utils.reader.shared_norm) is decoded as it was trained. Its loss sums
a target's start probability over every window that holds the target, and its end probability likewise: the
no-answer over every window's [CLS], a span over the windows that hold it whole. So its null score is the
log-sum-exp of the windows' [CLS] start logits plus that of their end logits, and a span's score (the same
character offsets, wherever the windows overlap) is the log-sum-exp of its start logits over the windows that hold
it plus that of its end logits: a span one window holds keeps its start + end logit. Both are the log of a
probability up to the same normalisers, so `null_minus_best` is the log ratio of the no-answer's probability to the
best span's. (Scoring a span by its best window alone would tilt a passage longer than a window towards abstaining
by up to twice the log of its number of windows.) Every example also carries what combining passages
needs: `null_start`/`null_end` (those log-sum-exps) and `lse_start`/`lse_end` (the log-sum-exp over every position
a start or end may take: context tokens and [CLS]); and `context_start`/`context_end`, the log-sum-exp over the
context tokens alone (what a passage's share of the answer is: exact where the no-answer holds nearly all the mass,
which lse minus null is not).
"""

from collections import defaultdict

import numpy as np
from tqdm.auto import tqdm

from utils.numeric import logsumexp

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def decode_spans(example_ids, windows_example_ids, windows_offsets, start_logits, end_logits,
                 n_best_size=20, max_answer_length=30, contexts=None, shared_norm: bool = False):
    """Return {example_id: {"text", "score", "null_score", "null_minus_best", "nbest"}} for every example id.

    windows_* are aligned with the rows of start_logits/end_logits (float arrays, one row per window,
    possibly of different lengths); contexts maps example id -> context string. "nbest" lists the
    `n_best_size` best distinct spans over all windows, best first, as {"text", "score", "start", "end"}
    (character offsets into the context); "text"/"score" are its first entry. `shared_norm`: the span and null scores of
    a reader trained with shared normalization (see the module docstring; the candidates are still the spans paired
    from each window's n best starts and ends).
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
            null_score = min(null_score, float(starts[0] + ends[0]))
            cls_s.append(starts[0])
            cls_e.append(ends[0])
            all_s.append(logsumexp(np.append(starts[0], starts[tokens])))
            all_e.append(logsumexp(np.append(ends[0], ends[tokens])))
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
        if shared_norm:  # each candidate scored over every window that holds it, as the loss sums it
            spans = {span: _summed_over_windows(span, read) for span in spans}
        # Best first; among equal scores the earlier span.
        best = sorted(spans.items(), key=lambda item: (-item[1], item[0]))[:n_best_size]
        nbest = [{"text": contexts[ex_id][a:b], "score": score, "start": a, "end": b} for (a, b), score in best]
        top = nbest[0] if nbest else {"text": "", "score": -np.inf}
        stats = {"null_start": logsumexp(cls_s), "null_end": logsumexp(cls_e), "lse_start": logsumexp(all_s),
                 "lse_end": logsumexp(all_e), "context_start": logsumexp(ctx_s), "context_end": logsumexp(ctx_e)}
        if shared_norm:
            null_score = stats["null_start"] + stats["null_end"]
        results[ex_id] = {"text": top["text"], "score": top["score"], "null_score": null_score,
                          "null_minus_best": null_score - top["score"] if nbest else np.inf, "nbest": nbest, **stats}
    return results


def _token_at(offsets, tokens) -> tuple[dict, dict]:
    """A window's context tokens (`tokens`, in order) by the character a span starts at and the one it ends at: the
    tokens the training labels take (utils.reader.windows.prepare_windows: where characters are shared, the last
    token starting at or before the span's start, the first ending at or after its end)."""
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
    """The abstain criterion, the one place it is written: no answer when the null score beats the best span by more
    than `threshold` (strictly: a question at the threshold is answered, which is how utils.reader.metrics.
    best_null_threshold scores the threshold it picks); None (a SQuAD v1.1 reader) always answers. The reader's
    predictions (apply_null_threshold) and the QA system's (utils.system.answer.answer) both decide by it."""
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
    """{example id: best span, its score, the null score, the n best spans} (see decode_spans). `windows`: the
    examples' windows with their example_id and offset_mapping; `decoding`: its n_best_size and max_answer_length
    (utils.reader.config.DecodingConfig, or the ReaderSettings a trained reader recorded them in)."""
    return decode_spans([ex["id"] for ex in examples], windows["example_id"], windows["offset_mapping"],
                        starts, ends, decoding.n_best_size, decoding.max_answer_length,
                        {ex["id"]: ex["context"] for ex in examples}, shared_norm)
