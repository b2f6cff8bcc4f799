"""The DPR evaluation: the corpus ranked for every dev question by the dense encoders (a passage by its best
sentence window with --window_sentences), by BM25 and by two hybrids of both, and Haystack's in-batch rank.

Every evaluation reports top-1/5/20/100, MRR@10 and the mean rank of the gold passage for each ranking, so a run
shows at once whether the trained encoder beats BM25 and whether it adds to it. The hybrid's dense weight is tuned
on the evaluation questions, cross-fitted (each half scored with the weight tuned on the other half).
"""

import logging

import numpy as np
import torch

from utils.retriever.bm25 import BM25
from utils.retriever.data import key_hash, passage_key, unique_passages
from utils.retriever.encoding import encode, encoding_loader, tokenize_passages, tokenize_questions
from utils.retriever.fusion import cross_fitted_fusion, reciprocal_rank_fusion
from utils.retriever.loss import batch_ranks
from utils.retriever.ranking import gold_ranks, passage_scores, retrieval_metrics, top_passages
from utils.retriever.sentence_windows import sentence_windows

logger = logging.getLogger("qa-amp")


class RetrievalEvaluation:
    """The dev questions, the corpus they are ranked against (tokenised once, as sentence windows with
    --window_sentences) and BM25's scores (computed once: the baseline and the lexical half of the hybrids)."""

    def __init__(self, accelerator, args, q_tok, p_tok, dev, corpus, dev_passages):
        self.accelerator, self.args = accelerator, args
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
        self.passage_loader = encoding_loader(accelerator, tokenize_passages(p_tok, windows, args), "passage",
                                              p_tok.pad_token_id, bs)
        self.question_loader = encoding_loader(accelerator, tokenize_questions(q_tok, [q["question"] for q in dev], args),
                                               "query", q_tok.pad_token_id, bs)
        self.bm25_scores = BM25(corpus).scores([q["question"] for q in dev])
        self.bm25_ranks = gold_ranks(self.bm25_scores, self.gold)

    def __call__(self, model) -> dict:
        w_emb = encode(self.accelerator, model, self.passage_loader, "passage", int(self.window_start[-1]))
        q_emb = encode(self.accelerator, model, self.question_loader, "query", len(self.dev))
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
        metrics["in_batch_avg_rank"] = self.in_batch_rank(q_emb, w_emb)
        for kind, r in (("bm25", self.bm25_ranks), ("hybrid", hybrid_ranks), ("rrf", rrf_ranks)):
            metrics.update({f"{kind}_{k}": v for k, v in retrieval_metrics(r).items()})
        metrics["hybrid_dense_weight"] = dense_weight
        top = top_passages(scores, 20)
        rankings = [{"id": q["id"], "question": q["question"], "gold_rank": int(r), "bm25_gold_rank": int(b),
                     "hybrid_gold_rank": int(h), "rrf_gold_rank": int(f),
                     "top20": [self.corpus[j]["passage_id"] or self.corpus[j]["text"][:80] for j in t]}
                    for q, r, b, h, f, t in zip(self.dev, ranks, self.bm25_ranks, hybrid_ranks, rrf_ranks, top)]
        return {"metrics": metrics, "rankings": rankings}

    def in_batch_rank(self, q_emb: torch.Tensor, w_emb: torch.Tensor) -> float:
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
