"""Texts tokenised once and embedded in bulk: questions and passages as the encoders take them (a passage as the
pair (title, text)), stored as flat token arrays and padded per batch on demand, and the loaders that embed a
whole set of texts sharded across processes (evaluation, the negatives refresh)."""

import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import AutoTokenizer

from utils.errors import UserError
from utils.max_length import check_max_length
from utils.runtime.batching import pad_batch


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


def load_tokenizers(query_path: str, passage_path: str, shared: bool, max_query_length: int,
                    max_passage_length: int) -> tuple:
    """(question tokenizer, passage tokenizer) of the encoders (one, with `shared`), with the lengths checked
    against what the encoders can take."""
    passage_path = query_path if shared else passage_path
    try:
        q_tok = AutoTokenizer.from_pretrained(query_path)
        p_tok = q_tok if shared else AutoTokenizer.from_pretrained(passage_path)
    except (OSError, ValueError) as err:
        raise UserError(f"cannot load a tokenizer ({str(err).splitlines()[0]})") from None
    check_max_length(query_path, q_tok, max_query_length=max_query_length)
    check_max_length(passage_path, p_tok, max_passage_length=max_passage_length)
    return q_tok, p_tok


def tokenize_questions(tokenizer, questions: list[str], max_length: int) -> Tokenized:
    return Tokenized(lambda qs: tokenizer(qs, truncation=True, max_length=max_length), questions)


def tokenize_passages(tokenizer, ctxs: list[dict], max_length: int, embed_title: bool) -> Tokenized:
    """Passages as the pair (title, text) (text cut first), or text alone without `embed_title`."""
    if embed_title:
        return Tokenized(lambda cs: tokenizer([c["title"] for c in cs], [c["text"] for c in cs],
                                              truncation="only_second", max_length=max_length), ctxs)
    return Tokenized(lambda cs: tokenizer([c["text"] for c in cs], truncation=True, max_length=max_length), ctxs)


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


def encode_texts(model, tokenized: Tokenized, side: str, pad_token_id: int, batch_size: int, device,
                 rows=None, progress: str | None = None) -> torch.Tensor:
    """Embeddings (fp32, on the CPU) of the texts `rows` of `tokenized` (default: all), in that order, by this process
    alone: what a process holds of a sharded corpus, or what the Retriever API indexes. `model` is the bare
    bi-encoder (no DDP wrapper: processes encode different numbers of batches). Longest first, so that each batch is
    padded only to lengths like its own; `progress` names a progress bar."""
    rows = np.arange(len(tokenized)) if rows is None else np.asarray(rows)
    perm = np.argsort(-tokenized.lengths[rows], kind="stable")  # position in `rows` of each text, longest first
    out = None
    bar = tqdm(total=len(rows), desc=progress, unit="texts", disable=progress is None, dynamic_ncols=True)
    with torch.no_grad():
        for s in range(0, len(perm), batch_size):
            where = perm[s:s + batch_size]
            batch = {k: v.to(device) for k, v in tokenized.batch(rows[where], pad_token_id).items()}
            emb = model(**{side: batch})[0 if side == "query" else 1].float().cpu()
            if out is None:
                out = torch.empty(len(rows), emb.shape[1])
            out[torch.from_numpy(where)] = emb
            bar.update(len(where))
    bar.close()
    return out if out is not None else torch.empty(0, 0)
