"""The DPR retriever as a task of the shared training loop: its training data (tokenised once, negatives
refreshed by the model being trained), its loss (in-batch and hard negatives gathered across processes,
optionally through GradCache), its evaluation (dense, BM25 and hybrid rankings of a corpus) and its outputs
(sentence-transformers and transformers DPR directories, rankings.jsonl).
"""

import json
import logging
import os
import time

import numpy as np
import torch
from accelerate.utils import broadcast, send_to_device
from torch.utils.data import DataLoader

from utils.bi_encoder import encoder_state, export_dpr, save_sentence_transformers_dir
from utils.bm25 import BM25, cross_fitted_fusion, reciprocal_rank_fusion
from utils.answers import normalized
from utils.dpr_data import (Tokenized, key_hash, passage_key, select_negatives, sentence_windows, text_key,
                            unique_passages)
from utils.dpr_loss import batch_ranks, global_loss
from utils.grad_cache import grad_cache_step
from utils.retrieval_metrics import gold_ranks, retrieval_metrics, top_passages
from utils.training import Task, load_weights

logger = logging.getLogger("qa-amp")


def tokenize_questions(tokenizer, questions: list[str], args) -> Tokenized:
    return Tokenized(lambda qs: tokenizer(qs, truncation=True, max_length=args.max_query_length), questions)


def tokenize_passages(tokenizer, ctxs: list[dict], args) -> Tokenized:
    """Passages as the pair (title, text) (text cut first), or text alone without --embed_title."""
    if args.embed_title:
        return Tokenized(lambda cs: tokenizer([c["title"] for c in cs], [c["text"] for c in cs],
                                              truncation="only_second", max_length=args.max_passage_length), ctxs)
    return Tokenized(lambda cs: tokenizer([c["text"] for c in cs], truncation=True,
                                          max_length=args.max_passage_length), ctxs)


class TrainingData:
    """The training questions and the passages they train against, tokenised once. `groups[i]` is question i's
    [positive, negatives...] as indices into `passages`. A refresh replaces the negatives; they are checkpointed
    (state_dict), so a resumed run trains on exactly the negatives the interrupted one had. With `mining`, the
    passages also include every other passage of the train file: the corpus refreshed negatives come from."""

    def __init__(self, questions, groups, q_tok, p_tok, args, mining: bool):
        ctxs = [c for g in groups for c in g]
        if mining:
            ctxs += [c for q in questions for c in q["positive_ctxs"] + q["hard_negative_ctxs"] + q["negative_ctxs"]]
        self.passages = unique_passages(ctxs)
        index = {text_key(c): i for i, c in enumerate(self.passages)}
        self.groups = np.array([[index[text_key(c)] for c in g] for g in groups], dtype=np.int64)
        # Masking compares passages, not texts: a window is a duplicate of every other window of its passage.
        self.keys = torch.tensor([key_hash(passage_key(c)) for c in self.passages], dtype=torch.long)
        self.normalized_texts = [normalized(c["text"]) for c in self.passages] if mining else None
        self.q = tokenize_questions(q_tok, [q["question"] for q in questions], args)
        self.p = tokenize_passages(p_tok, self.passages, args)
        self.q_pad, self.p_pad = q_tok.pad_token_id, p_tok.pad_token_id
        self.refreshes = []  # {"when", "changed", "seconds"} per refresh: a record for eval_results.json

    def batch(self, question_indices) -> dict:
        """Tokenised questions, their passages laid out question by question, and the passages' keys. Built when
        the batch is trained on (not when the loader prefetches it), so a refresh applies from the next batch."""
        rows = self.groups[question_indices].reshape(-1)
        return {"query": self.q.batch(question_indices, self.q_pad), "passage": self.p.batch(rows, self.p_pad),
                "passage_keys": self.keys[rows]}

    def tokens(self, question_indices) -> int:
        return int(self.q.lengths[question_indices].sum() + self.p.lengths[self.groups[question_indices]].sum())

    def state_dict(self):
        return {"negatives": torch.from_numpy(self.groups[:, 1:].copy()), "refreshes": self.refreshes}

    def load_state_dict(self, state):
        self.groups[:, 1:] = state["negatives"].numpy()
        self.refreshes = state["refreshes"]


def encoding_loader(accelerator, tokenized: Tokenized, side: str, pad_token_id: int, batch_size: int):
    """A prepared (sharded) loader over every text of `tokenized`, longest first so that each batch is padded
    only to lengths like its own; batches carry the texts' indices, for `encode` to put them back in order."""
    order = np.argsort(-tokenized.lengths, kind="stable").tolist()
    return accelerator.prepare(DataLoader(order, batch_size=batch_size, collate_fn=lambda idx: {
        side: tokenized.batch(idx, pad_token_id), "index": torch.tensor(idx)}))


def passage_scores(q: torch.Tensor, windows: torch.Tensor, owner: torch.Tensor, count: int) -> torch.Tensor:
    """Questions x passages: each passage scored by its best window (MaxP, Dai & Callan 2019). With one window per
    passage (owner = 0..count-1) these are the plain similarities."""
    scores = q @ windows.T
    if len(owner) == count:
        return scores
    best = torch.full((len(q), count), float("-inf"), dtype=scores.dtype)
    return best.scatter_reduce_(1, owner.expand(len(q), -1), scores, reduce="amax")


class DPRTask(Task):
    tracker_project = "qa-amp-dpr"
    samples_name = "questions"

    def __init__(self, accelerator, args, q_tok, p_tok, train, data: TrainingData, dev, corpus, dev_passages):
        self.accelerator, self.args, self.q_tok, self.p_tok = accelerator, args, q_tok, p_tok
        self.train, self.data = train, data
        self.dev, self.corpus, self.dev_passages = dev, corpus, dev_passages
        self.corpus_index = {passage_key(c): i for i, c in enumerate(corpus)}
        self.gold = [[self.corpus_index[passage_key(c)] for c in q["positive_ctxs"]] for q in dev]
        bs = args.per_device_eval_batch_size
        # The passages of the dev questions' training-style batches that the corpus lacks (their hard negatives, say)
        # are encoded too, for the in-batch rank only: the ranked corpus stays the one given.
        extra = unique_passages(c for g in dev_passages for c in g if passage_key(c) not in self.corpus_index)
        encoded = corpus + extra
        self.encoded_index = {passage_key(c): i for i, c in enumerate(encoded)}
        # Passages are ranked by their own embedding, or with --window_sentences by their best sentence window's.
        windows, owner = sentence_windows(encoded, args.window_sentences)
        self.window_start = np.searchsorted(owner, np.arange(len(encoded) + 1))  # passage i: rows start[i]:start[i+1]
        self.corpus_owner = torch.from_numpy(owner[:self.window_start[len(corpus)]])
        self.corpus_loader = encoding_loader(accelerator, tokenize_passages(p_tok, windows, args), "passage",
                                             p_tok.pad_token_id, bs)
        self.question_loader = encoding_loader(accelerator, tokenize_questions(q_tok, [q["question"] for q in dev], args),
                                               "query", q_tok.pad_token_id, bs)
        if args.refresh_negatives_every:  # the training questions and passages (windows already), to mine from
            self.train_passage_loader = encoding_loader(accelerator, data.p, "passage", data.p_pad, bs)
            self.train_question_loader = encoding_loader(accelerator, data.q, "query", data.q_pad, bs)
        # BM25 over the same corpus, scored once: the baseline each evaluation compares the dense ranking with,
        # and the lexical half of the two hybrids.
        self.bm25_scores = BM25(corpus).scores([q["question"] for q in dev])
        self.bm25_ranks = gold_ranks(self.bm25_scores, self.gold)

    @property
    def metric_directions(self) -> dict[str, str]:
        """Top-k and MRR@10 higher-is-better, mean ranks lower-is-better, dense and both hybrids. BM25's metrics
        never move and the hybrid's tuned weight is a setting: not choosable."""
        dense = {n: "min" if n == "mean_rank" else "max" for n in retrieval_metrics(np.ones(1, dtype=np.int64))}
        return {**dense, "in_batch_avg_rank": "min",
                **{f"{kind}_{n}": d for kind in ("hybrid", "rrf") for n, d in dense.items()}}

    @staticmethod
    def samples_in(batch):
        return len(batch)  # the loader yields question indices

    def tokens_in(self, batch):
        return self.data.tokens(batch.cpu().numpy())

    def checkpoint_objects(self) -> list:
        return [self.data] if self.args.refresh_negatives_every else []

    def model_inputs(self, batch):
        return send_to_device(self.data.batch(batch.cpu().numpy()), self.accelerator.device)

    def compute_loss(self, model, batch):
        q, p = model(query=batch["query"], passage=batch["passage"])
        return self._loss(q, p, batch["passage_keys"])

    def _loss(self, q, p, passage_keys):
        """(loss to backpropagate, loss to log): the global-batch loss, scaled by the world size for DDP's
        gradient average (utils.dpr_loss.global_loss)."""
        loss, for_backward = global_loss(q, p, passage_keys, self.args.temperature)
        return for_backward, loss

    def train_step(self, accelerator, model, batch, weight=1.0):
        if not self.args.grad_cache_chunk_size:
            return super().train_step(accelerator, model, batch, weight)
        # GradCache: the same step in chunks of --grad_cache_chunk_size questions (with their passages).
        batch = self.model_inputs(batch)
        n_q, size = len(batch["query"]["input_ids"]), self.args.grad_cache_chunk_size
        per_question = len(batch["passage"]["input_ids"]) // n_q
        take = lambda inputs, a, b: {k: v[a:b] for k, v in inputs.items()}  # noqa: E731
        chunks = [{"query": take(batch["query"], s, s + size),
                   "passage": take(batch["passage"], s * per_question, (s + size) * per_question)}
                  for s in range(0, n_q, size)]
        return grad_cache_step(accelerator, model, chunks, lambda m, chunk: m(**chunk),
                               lambda q, p: self._loss(q, p, batch["passage_keys"]), weight)

    # --- refreshed hard negatives (ANCE-style) ---

    def start_epoch(self, model, epoch: int) -> None:
        if self.args.refresh_negatives_every:
            self.refresh_negatives(model, f"epoch {epoch} start")

    def after_update(self, model, step: int) -> None:
        if self.args.refresh_negatives_every and step % self.args.refresh_negatives_every == 0:
            self.refresh_negatives(model, f"update {step}")

    def refresh_negatives(self, model, when: str) -> None:
        """Re-mine every training question's hard negatives with the model being trained: encode the training
        passages and questions (sharded across processes, as evaluation encodes its corpus), rank, and keep the
        best-ranked passages that are neither a positive nor answer-bearing (utils.dpr_data.select_negatives).
        Ranked on the main process and broadcast, so every process trains on the same negatives."""
        t0 = time.perf_counter()
        model.eval()
        with torch.no_grad():
            p = self.encode(model, self.train_passage_loader, "passage", len(self.data.p))
            q = self.encode(model, self.train_question_loader, "query", len(self.data.q))
        old = self.data.groups[:, 1:].copy()
        new = torch.from_numpy(old)
        if self.accelerator.is_main_process:
            depth = min(len(p), 4 * old.shape[1] + 50)  # deep enough to skip positives and false negatives
            ranked = torch.cat([(q[s:s + 1024] @ p.T).topk(depth, dim=1).indices for s in range(0, len(q), 1024)])
            new = torch.from_numpy(select_negatives(ranked.numpy(), self.train, self.data.passages, old.shape[1], old,
                                                    self.data.normalized_texts))
        new = broadcast(new.to(self.accelerator.device), from_process=0).cpu().numpy()
        self.data.groups[:, 1:] = new
        changed = int(sum(len(set(n) - set(o)) for n, o in zip(new.tolist(), old.tolist())))
        seconds = round(time.perf_counter() - t0, 1)
        logger.info("refreshed hard negatives (%s): %d of %d changed; %d passages encoded (%.1f MiB of embeddings), "
                    "%.1f s", when, changed, old.size, len(p), p.numel() * p.element_size() / 2**20, seconds)
        self.data.refreshes.append({"when": when, "changed": changed, "of": int(old.size), "seconds": seconds})
        self.accelerator.log({"train/negatives_changed": changed})

    # --- evaluation ---

    def encode(self, model, loader, side: str, count: int) -> torch.Tensor:
        """Embeddings (fp32, on the CPU) of all `count` texts behind an encoding_loader, gathered from every
        process, in the texts' order. Used by evaluation and by the negatives refresh."""
        out = None
        for batch in loader:
            emb = model(**{side: batch[side]})[0 if side == "query" else 1]
            emb, index = self.accelerator.gather_for_metrics((emb.float(), batch["index"]))
            if out is None:
                out = torch.empty(count, emb.shape[1])
            out[index.cpu()] = emb.cpu()
        return out

    def evaluate(self, model) -> dict:
        w_emb = self.encode(model, self.corpus_loader, "passage", int(self.window_start[-1]))
        q_emb = self.encode(model, self.question_loader, "query", len(self.dev))
        nan = {"questions": int(q_emb.isnan().any(1).sum()), "passages": int(w_emb.isnan().any(1).sum())}
        if any(nan.values()):
            logger.warning("NaN embeddings of %d dev questions and %d passages (a diverged encoder?): their scores "
                           "rank last", nan["questions"], nan["passages"])
        scores = passage_scores(q_emb, w_emb[:len(self.corpus_owner)], self.corpus_owner, len(self.corpus)).numpy()
        ranks = gold_ranks(scores, self.gold)
        # Hybrids: a convex combination of normalised scores, its dense weight tuned on these questions (each half
        # scored with the weight tuned on the other half: no question scores its own tuning), and untuned RRF.
        fused, dense_weight = cross_fitted_fusion(scores, self.bm25_scores, self.gold)
        hybrid_ranks = gold_ranks(fused, self.gold)
        rrf_ranks = gold_ranks(reciprocal_rank_fusion(scores, self.bm25_scores), self.gold)
        metrics = retrieval_metrics(ranks)
        metrics["in_batch_avg_rank"] = self._in_batch_rank(q_emb, w_emb)
        for kind, r in (("bm25", self.bm25_ranks), ("hybrid", hybrid_ranks), ("rrf", rrf_ranks)):
            metrics.update({f"{kind}_{k}": v for k, v in retrieval_metrics(r).items()})
        metrics["hybrid_dense_weight"] = dense_weight
        top = top_passages(scores, 20)
        rankings = [{"id": q["id"], "question": q["question"], "gold_rank": int(r), "bm25_gold_rank": int(b),
                     "hybrid_gold_rank": int(h), "rrf_gold_rank": int(f),
                     "top20": [self.corpus[j]["passage_id"] or self.corpus[j]["text"][:80] for j in t]}
                    for q, r, b, h, f, t in zip(self.dev, ranks, self.bm25_ranks, hybrid_ranks, rrf_ranks, top)]
        return {"metrics": metrics, "rankings": rankings}

    def _in_batch_rank(self, q_emb: torch.Tensor, w_emb: torch.Tensor) -> float:
        """Haystack's in-batch metric: the positive's rank among the passages of its training-style global
        batch (the batch's positives and hard negatives, each scored by its best window), averaged over dev
        questions."""
        bs, ranks = self.args.per_device_train_batch_size * self.accelerator.num_processes, []
        start = self.window_start
        for s in range(0, len(self.dev), bs):
            ctxs = [c for group in self.dev_passages[s:s + bs] for c in group]
            cols = [self.encoded_index[passage_key(c)] for c in ctxs]
            rows = np.concatenate([np.arange(start[c], start[c + 1]) for c in cols])
            owner = np.repeat(np.arange(len(cols)), [start[c + 1] - start[c] for c in cols])
            batch_scores = passage_scores(q_emb[s:s + bs], w_emb[rows], torch.from_numpy(owner), len(cols))
            keys = torch.tensor([key_hash(passage_key(c)) for c in ctxs])
            ranks.append(batch_ranks(batch_scores, keys).float())
        return float(torch.cat(ranks).mean())

    def headline(self, m: dict) -> str:
        return (f"top1 {m['top1']:.1f} top5 {m['top5']:.1f} top20 {m['top20']:.1f} MRR@10 {m['mrr@10']:.3f} "
                f"mean rank {m['mean_rank']:.1f} in-batch avg rank {m['in_batch_avg_rank']:.2f} | BM25 top1 "
                f"{m['bm25_top1']:.1f} MRR@10 {m['bm25_mrr@10']:.3f} | hybrid (dense weight "
                f"{m['hybrid_dense_weight']:.2f}) top1 {m['hybrid_top1']:.1f} MRR@10 {m['hybrid_mrr@10']:.3f} | RRF top1 "
                f"{m['rrf_top1']:.1f}")

    def write_outputs(self, directory, result):
        with open(os.path.join(directory, "rankings.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in result["rankings"])

    def summary(self, result):
        out = {"pooling": self.args.pooling, "similarity": self.args.similarity, "temperature": self.args.temperature,
               "window_sentences": self.args.window_sentences, "corpus_passages": len(self.corpus)}
        if self.args.refresh_negatives_every:
            out["negatives_refreshed"] = self.data.refreshes
        return out

    def save(self, model, directory, state_dict):
        for side, tok in (("query", self.q_tok), ("passage", self.p_tok)):
            max_len = self.args.max_query_length if side == "query" else self.args.max_passage_length
            save_sentence_transformers_dir(model.encoder(side), encoder_state(model, state_dict, side), tok,
                                           os.path.join(directory, f"{side}_encoder"), self.args.pooling,
                                           self.args.similarity == "cosine", max_len)
            if self.args.export_dpr:
                export_dpr(model.encoder(side), encoder_state(model, state_dict, side), tok,
                           os.path.join(directory, "dpr_question_encoder" if side == "query" else "dpr_context_encoder"),
                           side)

    def load(self, model, directory):
        for side in ("query", "passage"):
            load_weights(model.encoder(side), os.path.join(directory, f"{side}_encoder", "model.safetensors"))


