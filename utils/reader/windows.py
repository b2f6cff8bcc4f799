"""Turn QA examples into model inputs: sliding windows over the context, each with what its reader needs.

A context longer than the window is split into overlapping windows (`doc_stride` tokens of overlap). One builder,
`prepare_windows`, makes them all; its `labels` say what a window carries. Training labels point at an answer's
first and last token inside a window; a window that does not contain the whole answer, and every window of an
unanswerable question, is labelled with the [CLS] position (index 0), the "no answer" target of SQuAD v2 models.
Evaluation windows keep the character offsets of context tokens (None elsewhere) so spans decode back to text.
"""

from transformers import AutoTokenizer

from utils.errors import UserError
from utils.max_length import check_max_length

LABELS = ("answer", "spans", "offsets")  # what a window carries: see prepare_windows
# Raised whenever what prepare_windows writes changes (its columns, its labels): part of the cache key of tokenised
# windows (utils.reader.windows_cache), so that a cache written by an older version is never read as this one's.
WINDOWS_FORMAT = 2


def load_tokenizer(model_name_or_path: str, max_seq_length: int):
    """The model's tokenizer, checked to cut windows (check_tokenizer) of `max_seq_length` tokens, which the model
    must be able to take: a one-line UserError otherwise."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
    except (OSError, ValueError) as err:
        raise UserError(f"{model_name_or_path}: cannot load a tokenizer ({str(err).splitlines()[0]})") from None
    check_tokenizer(tokenizer, model_name_or_path)
    check_max_length(model_name_or_path, tokenizer, max_seq_length=max_seq_length)
    return tokenizer


def check_tokenizer(tokenizer, name: str) -> None:
    """Span extraction maps tokens back to characters (a fast tokenizer's offsets) and finds a window's [CLS] at
    position 0 (right padding)."""
    if not tokenizer.is_fast:
        raise UserError(f"{name}: the tokenizer is not a fast (Rust) tokenizer; span extraction needs offset mapping")
    if tokenizer.padding_side != "right":
        raise UserError(f"{name}: only right-padding tokenizers are supported (got {tokenizer.padding_side})")


def truncate_questions(questions: list[str], tokenizer, max_query_length: int) -> list[str]:
    """Cut each question to at most `max_query_length` tokens (cut on a token's character boundary)."""
    # Strip before tokenising: the cut below uses the offsets of the very string it cuts. (Leading spaces
    # only waste window room; stripped after tokenising, they shifted the cut past max_query_length tokens.)
    questions = [q.lstrip() for q in questions]
    enc = tokenizer(questions, add_special_tokens=False, return_offsets_mapping=True)
    return [q if len(offsets) <= max_query_length else q[: offsets[max_query_length - 1][1]]
            for q, offsets in zip(questions, enc["offset_mapping"])]


def prepare_windows(batch, tokenizer, max_seq_length, doc_stride, max_query_length, labels: str,
                    one_window: bool = False):
    """datasets.map(batched=True) function: (question, context) examples -> windows, each carrying its `labels`:
    "answer" (training): `start_positions`/`end_positions` of the example's first reference answer (SQuAD train has
    one per question), [CLS] where it is not whole in the window or there is none, and where its context starts and
    ends (the positions a teacher's distribution is compared over, utils.reader.distillation); "spans" (training
    with shared normalization, utils.reader.shared_norm, on (question, passage) pairs): its `pair`, where its
    context starts and ends, and the token spans of every character span of the pair's `spans` it holds whole
    (`starts`/`ends`: lists, empty when it holds none); "offsets" (evaluation and prediction): its `example_id` and
    the character offsets of its context tokens (None elsewhere). `one_window`: only the first window of each
    example, however long its context (negative passages: an epoch's number of windows stays what was planned)."""
    if labels not in LABELS:
        raise ValueError(f"labels must be one of {LABELS} (got {labels!r})")
    questions = truncate_questions(batch["question"], tokenizer, max_query_length)
    enc = tokenizer(
        questions,
        batch["context"],
        truncation="only_second",
        max_length=max_seq_length,
        stride=0 if one_window else doc_stride,
        return_overflowing_tokens=not one_window,
        return_offsets_mapping=True,
        padding=False,  # padded per batch by the collator (dynamic padding)
    )
    sample_map = range(len(enc["input_ids"])) if one_window else enc.pop("overflow_to_sample_mapping")
    if labels == "offsets":
        enc["example_id"] = []
        for i in range(len(enc["input_ids"])):
            seq_ids = enc.sequence_ids(i)
            enc["example_id"].append(batch["id"][sample_map[i]])
            enc["offset_mapping"][i] = [o if seq_ids[k] == 1 else None for k, o in enumerate(enc["offset_mapping"][i])]
        return enc
    offsets_all = enc.pop("offset_mapping")
    columns = ("start_positions", "end_positions", "context_start", "context_end") if labels == "answer" else \
        ("pair", "context_start", "context_end", "starts", "ends")
    for key in columns:
        enc[key] = []
    for i, offsets in enumerate(offsets_all):
        if labels == "answer":
            answers = batch["answers"][sample_map[i]]
            first = answers["answer_start"][0] if answers["text"] else 0
            spans = [(first, first + len(answers["text"][0]))] if answers["text"] else []
            (ctx_start, ctx_end), whole = _whole_spans(enc.sequence_ids(i), offsets, spans)
            start, end = whole[0] if whole else (0, 0)  # [CLS]: no answer in this window
            enc["start_positions"].append(start)
            enc["end_positions"].append(end)
            enc["context_start"].append(ctx_start)
            enc["context_end"].append(ctx_end)
            continue
        (ctx_start, ctx_end), whole = _whole_spans(enc.sequence_ids(i), offsets, batch["spans"][sample_map[i]])
        enc["pair"].append(batch["pair"][sample_map[i]])
        enc["context_start"].append(ctx_start)
        enc["context_end"].append(ctx_end)
        enc["starts"].append([start for start, _ in whole])
        enc["ends"].append([end for _, end in whole])
    return enc


def _whole_spans(seq_ids, offsets, spans) -> tuple[tuple[int, int], list[tuple[int, int]]]:
    """A window's context (its first and last token) and the (first, last) tokens of each character span of `spans`
    it holds whole, in order."""
    ctx_start = seq_ids.index(1)
    ctx_end = len(seq_ids) - 1 - seq_ids[::-1].index(1)
    whole = []
    for start_char, end_char in spans:
        if not (offsets[ctx_start][0] <= start_char and offsets[ctx_end][1] >= end_char):
            continue  # not whole in this window
        start = ctx_start
        while start <= ctx_end and offsets[start][0] <= start_char:
            start += 1
        end = ctx_end
        while end >= ctx_start and offsets[end][1] >= end_char:
            end -= 1
        whole.append((start - 1, end + 1))
    return (ctx_start, ctx_end), whole
