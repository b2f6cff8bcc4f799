"""Reader windows tokenised once: datasets.map over in-memory examples, cached on disk under a key of everything
that shapes the windows (the examples, the tokenizer's vocabulary, the window settings)."""

import hashlib
import json
import os

import datasets

from utils.reader.config import WindowConfig
from utils.reader.windows import WINDOWS_FORMAT, prepare_windows

datasets.disable_progress_bars()  # one bar per tokenisation pass and cache load: noise, not information


def tokenize_windows(accelerator, tokenizer, examples: list[dict], window_config: WindowConfig, labels: str,
                     one_window: bool = False) -> datasets.Dataset:
    """`examples` through utils.reader.windows.prepare_windows (`labels`, `one_window`: what the windows carry, and
    whether only each example's first) at `window_config`'s settings, cached (see cached_map)."""
    vocab = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()
    c = window_config
    settings = dict(max_seq_length=c.max_seq_length, doc_stride=c.doc_stride, max_query_length=c.max_query_length,
                    labels=labels, one_window=one_window)
    return cached_map(accelerator, examples, prepare_windows, dict(tokenizer=tokenizer, **settings),
                      dict(vocab=vocab, format=WINDOWS_FORMAT, **settings), c.cache_dir, c.preprocessing_num_workers)


def cached_map(accelerator, examples: list[dict], fn, fn_kwargs: dict, key_parts: dict, cache_dir: str | None,
               num_proc: int | None, remove_columns: bool = True) -> datasets.Dataset:
    """Tokenise `examples` with `fn` (batched datasets.map). The main process builds the cache file first;
    the others (and later runs with the same data, tokenizer and settings) load it."""
    cache_dir = cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "qa-amp")
    os.makedirs(cache_dir, exist_ok=True)
    digest = hashlib.sha256(json.dumps([examples, key_parts, fn.__module__, fn.__name__], sort_keys=True,
                                       default=str).encode()).hexdigest()[:24]
    raw = datasets.Dataset.from_list(examples)
    with accelerator.main_process_first():
        return raw.map(fn, batched=True, fn_kwargs=fn_kwargs, num_proc=num_proc,
                       remove_columns=raw.column_names if remove_columns else None,
                       cache_file_name=os.path.join(cache_dir, f"{fn.__name__}-{digest}.arrow"),
                       load_from_cache_file=True, desc=fn.__name__)
