"""Turn QA examples into model inputs: sliding windows over the context with start/end labels.

A context longer than the window is split into overlapping windows (`doc_stride` tokens of overlap).
Training labels point at the answer's first and last token inside a window; a window that does
not contain the whole answer, and every window of an unanswerable question, is labelled with the
[CLS] position (index 0), the "no answer" target of SQuAD v2 models. Evaluation features keep the
character offsets of context tokens (None elsewhere) so spans decode back to text.
"""

from utils.loop.errors import UserError


def check_tokenizer(tokenizer, name: str) -> None:
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


def _windows(batch, tokenizer, max_seq_length, doc_stride, max_query_length):
    questions = truncate_questions(batch["question"], tokenizer, max_query_length)
    return tokenizer(
        questions,
        batch["context"],
        truncation="only_second",
        max_length=max_seq_length,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding=False,  # padded per batch by the collator (dynamic padding)
    )


def prepare_train_features(batch, tokenizer, max_seq_length, doc_stride, max_query_length):
    """datasets.map(batched=True) function: examples -> training windows with start/end positions."""
    enc = _windows(batch, tokenizer, max_seq_length, doc_stride, max_query_length)
    sample_map = enc.pop("overflow_to_sample_mapping")
    offsets_all = enc.pop("offset_mapping")
    enc["start_positions"], enc["end_positions"] = [], []
    for i, offsets in enumerate(offsets_all):
        answers = batch["answers"][sample_map[i]]
        start, end = 0, 0  # [CLS]: no answer in this window
        if answers["text"]:
            # Train on the first reference answer (SQuAD train has one per question).
            start_char = answers["answer_start"][0]
            end_char = start_char + len(answers["text"][0])
            seq_ids = enc.sequence_ids(i)
            ctx_start = seq_ids.index(1)
            ctx_end = len(seq_ids) - 1 - seq_ids[::-1].index(1)
            if offsets[ctx_start][0] <= start_char and offsets[ctx_end][1] >= end_char:
                start = ctx_start
                while start <= ctx_end and offsets[start][0] <= start_char:
                    start += 1
                start -= 1
                end = ctx_end
                while end >= ctx_start and offsets[end][1] >= end_char:
                    end -= 1
                end += 1
        enc["start_positions"].append(start)
        enc["end_positions"].append(end)
    return enc


def prepare_eval_features(batch, tokenizer, max_seq_length, doc_stride, max_query_length):
    """datasets.map(batched=True) function: examples -> windows that remember their example and offsets."""
    enc = _windows(batch, tokenizer, max_seq_length, doc_stride, max_query_length)
    sample_map = enc.pop("overflow_to_sample_mapping")
    enc["example_id"] = []
    for i in range(len(enc["input_ids"])):
        seq_ids = enc.sequence_ids(i)
        enc["example_id"].append(batch["id"][sample_map[i]])
        enc["offset_mapping"][i] = [o if seq_ids[k] == 1 else None for k, o in enumerate(enc["offset_mapping"][i])]
    return enc


def prepare_negative_features(batch, tokenizer, max_seq_length, doc_stride, max_query_length):
    """datasets.map function: (question, passage without its answer) -> one window, labelled with [CLS] (no answer).
    One window each, however long the passage: an epoch's number of windows stays what was planned."""
    questions = truncate_questions(batch["question"], tokenizer, max_query_length)
    enc = tokenizer(questions, batch["context"], truncation="only_second", max_length=max_seq_length, padding=False)
    enc["start_positions"] = [0] * len(enc["input_ids"])
    enc["end_positions"] = [0] * len(enc["input_ids"])
    return enc


def prepare_group_features(batch, tokenizer, max_seq_length, doc_stride, max_query_length):
    """datasets.map function for readers trained with shared normalization: (question, passage) pairs -> windows,
    each with its pair, where its context starts and ends, and the token spans of every answer occurrence it holds
    whole (`starts`/`ends`: lists, empty when it holds none). The loss pools a question's windows
    (utils.reader.shared_norm)."""
    enc = _windows(batch, tokenizer, max_seq_length, doc_stride, max_query_length)
    sample_map = enc.pop("overflow_to_sample_mapping")
    offsets_all = enc.pop("offset_mapping")
    for key in ("pair", "context_start", "context_end", "starts", "ends"):
        enc[key] = []
    for i, offsets in enumerate(offsets_all):
        seq_ids = enc.sequence_ids(i)
        ctx_start = seq_ids.index(1)
        ctx_end = len(seq_ids) - 1 - seq_ids[::-1].index(1)
        starts, ends = [], []
        for start_char, end_char in batch["spans"][sample_map[i]]:
            if not (offsets[ctx_start][0] <= start_char and offsets[ctx_end][1] >= end_char):
                continue  # not whole in this window
            start = ctx_start
            while start <= ctx_end and offsets[start][0] <= start_char:
                start += 1
            end = ctx_end
            while end >= ctx_start and offsets[end][1] >= end_char:
                end -= 1
            starts.append(start - 1)
            ends.append(end + 1)
        enc["pair"].append(batch["pair"][sample_map[i]])
        enc["context_start"].append(ctx_start)
        enc["context_end"].append(ctx_end)
        enc["starts"].append(starts)
        enc["ends"].append(ends)
    return enc
