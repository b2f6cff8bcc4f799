"""Texts tokenised once and embedded in bulk: questions and passages as the encoders take them (a passage as the
pair (title, text)), stored as flat token arrays and padded per batch on demand, and the loaders that embed a
whole set of texts sharded across processes (evaluation, the negatives refresh)."""

import numpy as np
import torch
from torch.utils.data import DataLoader

from utils.loop.batching import pad_batch


class Tokenized:
    """Texts tokenised once (not in every collate call), stored flat as int32 arrays: a batch of any of them is
    padded to its longest (a multiple of 8, right padding) on demand."""

    def __init__(self, encode, texts: list, chunk: int = 8192):
        arrays, lengths = {}, []
        for s in range(0, len(texts), chunk):  # chunks: a corpus of millions never becomes one Python list
            enc = encode(texts[s:s + chunk])
            lengths += [len(x) for x in enc["input_ids"]]
            for key in ("input_ids", "token_type_ids", "attention_mask"):
                if key in enc:
                    arrays.setdefault(key, []).append(np.fromiter((t for x in enc[key] for t in x), dtype=np.int32))
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)])
        self.arrays = {k: np.concatenate(v) for k, v in arrays.items()}

    def __len__(self):
        return len(self.lengths)

    def batch(self, indices, pad_token_id: int) -> dict:
        return pad_batch([{key: flat[self.offsets[i]:self.offsets[i + 1]].tolist() for key, flat in self.arrays.items()}
                          for i in indices], pad_token_id)


def tokenize_questions(tokenizer, questions: list[str], args) -> Tokenized:
    return Tokenized(lambda qs: tokenizer(qs, truncation=True, max_length=args.max_query_length), questions)


def tokenize_passages(tokenizer, ctxs: list[dict], args) -> Tokenized:
    """Passages as the pair (title, text) (text cut first), or text alone without --embed_title."""
    if args.embed_title:
        return Tokenized(lambda cs: tokenizer([c["title"] for c in cs], [c["text"] for c in cs],
                                              truncation="only_second", max_length=args.max_passage_length), ctxs)
    return Tokenized(lambda cs: tokenizer([c["text"] for c in cs], truncation=True,
                                          max_length=args.max_passage_length), ctxs)


def encoding_loader(accelerator, tokenized: Tokenized, side: str, pad_token_id: int, batch_size: int):
    """A prepared (sharded) loader over every text of `tokenized`, longest first so that each batch is padded
    only to lengths like its own; batches carry the texts' indices, for `encode` to put them back in order."""
    order = np.argsort(-tokenized.lengths, kind="stable").tolist()
    return accelerator.prepare(DataLoader(order, batch_size=batch_size, collate_fn=lambda idx: {
        side: tokenized.batch(idx, pad_token_id), "index": torch.tensor(idx)}))


def encode(accelerator, model, loader, side: str, count: int) -> torch.Tensor:
    """Embeddings (fp32, on the CPU) of all `count` texts behind an encoding_loader, gathered from every process, in
    the texts' order. Used by evaluation and by the negatives refresh."""
    out = None
    for batch in loader:
        emb = model(**{side: batch[side]})[0 if side == "query" else 1]
        emb, index = accelerator.gather_for_metrics((emb.float(), batch["index"]))
        if out is None:
            out = torch.empty(count, emb.shape[1])
        out[index.cpu()] = emb.cpu()
    return out
