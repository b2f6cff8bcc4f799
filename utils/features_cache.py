"""datasets.map over in-memory examples, cached on disk under a key of everything that shapes the output."""

import hashlib
import json
import os

import datasets


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
