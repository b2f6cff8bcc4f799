"""Windows and labels with the real MiniLM fast tokenizer: labelled spans decode back to the answers."""

import os

import pytest
from conftest import SAMPLE

from utils.files.squad import load_squad
from utils.reader.windows import prepare_windows, truncate_questions


def columns(examples):
    return {k: [e[k] for e in examples] for k in examples[0]}


def test_labels_round_trip_to_the_answer_text_on_the_sample(tokenizer):
    examples, _ = load_squad(f"{SAMPLE}/train.json")
    enc = prepare_windows(columns(examples), tokenizer, 384, 128, 64, labels="answer")
    offsets = prepare_windows(columns(examples), tokenizer, 384, 128, 64, labels="offsets")["offset_mapping"]
    assert len(offsets) == len(examples) == len(enc["input_ids"])
    answerable = 0
    for i, ex in enumerate(examples):  # contexts are short: one window per example
        s, e = enc["start_positions"][i], enc["end_positions"][i]
        if not ex["answers"]["text"]:
            assert (s, e) == (0, 0)
            continue
        answerable += 1
        assert ex["context"][offsets[i][s][0]:offsets[i][e][1]] == ex["answers"]["text"][0]
    assert answerable > 150


def test_long_context_windows_label_answers_outside_a_window_as_no_answer(tokenizer):
    filler = " ".join(f"word{i}" for i in range(300))
    context = f"{filler} The lighthouse was lit in 1871. {filler}"
    start = context.index("1871")
    batch = {"id": ["q"], "question": ["When was it lit?"], "context": [context],
             "answers": [{"text": ["1871"], "answer_start": [start]}]}
    enc = prepare_windows(batch, tokenizer, 128, 32, 64, labels="answer")
    assert len(enc["input_ids"]) > 3  # several overlapping windows
    labelled = [(s, e) for s, e in zip(enc["start_positions"], enc["end_positions"]) if s != 0]
    assert labelled and len(labelled) < len(enc["input_ids"])
    for i, (s, e) in enumerate(zip(enc["start_positions"], enc["end_positions"])):
        if s:
            assert tokenizer.decode(enc["input_ids"][i][s:e + 1]) == "1871"
        assert len(enc["input_ids"][i]) <= 128

    ev = prepare_windows(batch, tokenizer, 128, 32, 64, labels="offsets")
    assert ev["example_id"] == ["q"] * len(ev["input_ids"])
    for i, offsets in enumerate(ev["offset_mapping"]):
        ctx = [o for o in offsets if o is not None]
        assert offsets[0] is None and ctx  # [CLS] and question tokens carry no offsets
        assert all(context[a:b].strip() for a, b in ctx)


def test_questions_are_cut_to_max_query_length(tokenizer):
    q = "why " * 100 + "?"
    cut = truncate_questions([q, "Who?"], tokenizer, 10)
    assert len(tokenizer(cut[0], add_special_tokens=False)["input_ids"]) == 10
    assert cut[1] == "Who?"


@pytest.mark.parametrize("leading_spaces", [0, 3, 40])
def test_leading_whitespace_does_not_let_a_question_past_max_query_length(tokenizer, leading_spaces):
    question = " " * leading_spaces + "In which year did the lighthouse keeper first light the great lamp?"
    (cut,) = truncate_questions([question], tokenizer, 8)
    tokens = tokenizer(cut, add_special_tokens=False)["input_ids"]
    assert len(tokens) <= 8, (leading_spaces, cut, len(tokens))
    assert tokenizer.decode(tokens) == "in which year did the lighthouse keeper first"  # the first 8, still


@pytest.mark.parametrize("stride", [0, 16])
def test_every_context_token_is_covered_by_some_window(tokenizer, stride):
    context = " ".join(f"tok{i}" for i in range(200))
    ev = prepare_windows({"id": ["q"], "question": ["Q?"], "context": [context]}, tokenizer, 64, stride, 8,
                         labels="offsets")
    covered = {tuple(o) for offsets in ev["offset_mapping"] for o in offsets if o is not None}
    full = tokenizer(context, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    assert {tuple(o) for o in full} == covered


def test_windows_cached_by_another_format_are_not_read_as_this_ones(tokenizer, tmp_path, monkeypatch):
    """The cache key holds the windows' format: a cache written before training windows carried their context
    bounds was read back without them, and a run with a teacher died on the missing columns."""
    from accelerate import Accelerator

    import utils.reader.windows_cache as windows_cache
    from utils.reader.config import WindowConfig

    examples = [{"id": "1", "question": "Who built the loom?", "context": "Ada built a loom in 1843.",
                 "answers": {"text": ["Ada"], "answer_start": [0]}}]
    config = WindowConfig(max_seq_length=64, doc_stride=16, max_query_length=16, cache_dir=str(tmp_path))
    windows = windows_cache.tokenize_windows(Accelerator(cpu=True), tokenizer, examples, config, labels="answer")
    assert {"context_start", "context_end"} <= set(windows.column_names)
    first = set(os.listdir(tmp_path))
    monkeypatch.setattr(windows_cache, "WINDOWS_FORMAT", windows_cache.WINDOWS_FORMAT + 1)
    windows_cache.tokenize_windows(Accelerator(cpu=True), tokenizer, examples, config, labels="answer")
    assert set(os.listdir(tmp_path)) - first  # written anew under its own key, not loaded
