"""The DPR evaluation: the corpus ranked for every dev question by the dense encoders (a passage by its best
sentence window with --window_sentences), by BM25 and by two hybrids of both, and Haystack's in-batch rank.

Every evaluation reports top-1/5/20/100, MRR@10 and the mean rank of the gold passage for each ranking, so a run
shows at once whether the trained encoder beats BM25 and whether it adds to it. Nothing builds the questions x
corpus matrix: each process encodes and searches its own shard of the corpus (utils.search.exact), BM25 scores
one question at a time, and the hybrids fuse the two rankings' candidates (utils.search.fusion). The convex
hybrid's metrics mean the same in a training run and in the eval-only mode: `hybrid_*` cross-fitted (each half of
the questions scored with the dense weight tuned on the other half), `hybrid_tuned_*` at the weight tuned on all of
them (an upper bound; a training run records this weight), and, in the eval-only mode, `hybrid_recorded_*` at the
retriever's recorded weight.
"""

import logging
from dataclasses import dataclass

import numpy as np
import torch
from accelerate.utils import gather_object

from utils.files.corpus import key_hash, load_passages, passage_key, unique_passages
from utils.files.dpr import evaluation_corpus, load_dpr, training_passages
from utils.index.config import CorpusConfig
from utils.index.index import Index
from utils.retriever.config import EncoderConfig, NegativesConfig, RetrieverEvaluationConfig
from utils.retriever.encoding import encode, encode_texts, encoding_loader, tokenize_passages, tokenize_questions
from utils.retriever.loss import batch_ranks
from utils.retriever.sentence_windows import sentence_windows
from utils.runtime.process import bare_model
from utils.search.bm25 import BM25
from utils.search.exact import Vectors, dense_search, score_passages, score_shards
from utils.search.fusion import (CANDIDATES, convex_fusion, cross_fitted_ranks, fused_gold_ranks, gather_candidates,
                                 reciprocal_rank_fusion)
from utils.search.ranking import retrieval_metrics
from utils.search.shards import shard, summed_counts

logger = logging.getLogger("qa-amp")


@dataclass(frozen=True)
class EvaluationData:
    questions: list[dict]
    """The dev questions (DPR), each with its positives as the gold passages."""
    passages: list[dict]
    """The passages ranked for every question: the corpus given (or the index's), plus any gold passage it lacks;
    without either, every context of the dev file."""
    question_passages: list[list[dict]]
    """Each question's training-style passages, its positive then its negatives: the batches of the in-batch rank."""


def load_evaluation_data(config: RetrieverEvaluationConfig, corpus_config: CorpusConfig, negatives: NegativesConfig,
                         seed: int) -> EvaluationData:
    """The dev questions, the corpus they are ranked against, and the passages of their training-style batches
    (their negatives drawn as the training questions' are, with `seed`)."""
    questions = load_dpr(config.validation_file)[:config.max_eval_samples]
    if corpus_config.index:  # the passages of a built index (checked when it was built), in its order
        passages = list(Index.load(corpus_config.index).passages)
    else:
        passages = load_passages(corpus_config.passages) if corpus_config.passages else None
    corpus, added = evaluation_corpus(questions, passages)
    if added:
        logger.warning("%d gold passages of the dev file are not in %s; added them to the ranked corpus", added,
                       corpus_config.index or corpus_config.passages)
    return EvaluationData(questions, corpus,
                          training_passages(questions, negatives.num_hard_negatives, seed))


class RetrievalEvaluation:
    """The dev questions and the corpus they are ranked against: this process's shard of it, tokenised once (as
    sentence windows with window_sentences), BM25 over all of it, and the dev questions' training-style batches
    for the in-batch rank."""

    def __init__(self, accelerator, encoders: EncoderConfig, config: RetrieverEvaluationConfig, q_tok, p_tok,
                 data: EvaluationData, batch_size: int, train_batch_size: int, recorded_weight=None,
                 index_shards=None, indexed: int = 0):
        """`batch_size`: texts per forward pass per process when embedding without gradients (evaluation, the
        negatives refresh); `train_batch_size`: questions per process of a training batch (the in-batch rank ranks
        each positive among the passages of its training-style global batch).
        `recorded_weight`: also rank the hybrid at this dense weight (a trained retriever's: `hybrid_recorded_*`).
        `index_shards`: this process's shards of an index of the corpus's first `indexed` passages (utils.search.
        index), searched instead of embedding them; the rest of the corpus (gold passages the index lacks) is
        embedded by the last process."""
        self.accelerator, self.encoders, self.config, self.data = accelerator, encoders, config, data
        self.recorded_weight, self.batch_size, self.train_batch_size = recorded_weight, batch_size, train_batch_size
        dev, corpus = data.questions, data.passages
        self.p_pad = p_tok.pad_token_id
        position = {passage_key(c): i for i, c in enumerate(corpus)}
        # each gold passage once: a positive listed twice must not count against itself in the ranks
        self.gold = [list(dict.fromkeys(position[passage_key(c)] for c in q["positive_ctxs"])) for q in dev]
        self.gold_ids = _padded(self.gold)
        self.index_shards = index_shards or []
        if index_shards is None:  # each process embeds its shard of the corpus
            self.shard = shard(len(corpus), accelerator.process_index, accelerator.num_processes)
        else:
            last = accelerator.process_index == accelerator.num_processes - 1
            self.shard = range(indexed, len(corpus) if last else indexed)
        windows, owner = sentence_windows(corpus[self.shard.start:self.shard.stop], encoders.window_sentences)
        self.shard_owner = owner if encoders.window_sentences else None
        self.shard_tokens = tokenize_passages(p_tok, windows, encoders.max_passage_length, encoders.embed_title)
        # The passages of the dev questions' training-style batches that the corpus lacks (their hard negatives,
        # say) are encoded too, on every process, for the in-batch rank only: the ranked corpus stays the one given.
        extra = unique_passages(c for g in data.question_passages for c in g if passage_key(c) not in position)
        extra_windows, self.extra_owner = sentence_windows(extra, encoders.window_sentences)
        self.extra_tokens = (tokenize_passages(p_tok, extra_windows, encoders.max_passage_length, encoders.embed_title)
                             if extra else None)
        # where each in-batch passage's embedding is: (corpus id, None), or (None, id among the extra ones)
        self.in_batch_ids = {passage_key(c): (position[passage_key(c)], None)
                             for g in data.question_passages for c in g if passage_key(c) in position}
        self.in_batch_ids.update({passage_key(c): (None, i) for i, c in enumerate(extra)})
        self.question_loader = encoding_loader(accelerator, tokenize_questions(q_tok, [q["question"] for q in dev],
                                                                                  encoders.max_query_length),
                                               "query", q_tok.pad_token_id, batch_size)
        self.bm25 = BM25(corpus)
        self.bm25_share = shard(len(dev), accelerator.process_index, accelerator.num_processes)  # of the questions

    def __call__(self, model) -> dict:
        acc, device = self.accelerator, self.accelerator.device
        dev, corpus = self.data.questions, self.data.passages
        q_emb = encode(acc, model, self.question_loader, "query", len(dev)).to(device)
        bare, bs = bare_model(acc, model), self.batch_size
        vectors = self.index_shards + ([Vectors(encode_texts(bare, self.shard_tokens, "passage", self.p_pad,
                                                             bs, device),
                                                self.shard_owner, len(self.shard), self.shard.start)]
                                       if len(self.shard) else [])
        self._warn_nan(q_emb, vectors)
        dense_s, dense_i, ranks = dense_search(q_emb, vectors, CANDIDATES, self.gold_ids)
        # BM25, a share of the questions on each process: its own top passages, and its scores of the dense ones.
        mine = self.bm25_share
        lex_s, lex_i, lex_ranks, lex_of_dense = (np.concatenate(parts) for parts in zip(*gather_object([
            self.bm25.search([q["question"] for q in dev[mine.start:mine.stop]], CANDIDATES,
                             self.gold[mine.start:mine.stop], dense_i[mine.start:mine.stop])])))
        dense_of_lex = score_shards(q_emb, vectors, lex_i, distributed=True)
        candidates = gather_candidates(dense_s, dense_i, lex_s, lex_i, lex_of_dense, dense_of_lex)
        # The hybrid's metrics mean the same in both modes: `hybrid_*` cross-fitted (each half of the questions fused
        # with the weight tuned on the other half: an estimate), `hybrid_tuned_*` at the weight tuned on all of them
        # (an upper bound on these questions; what a training run records), and in the eval-only mode
        # `hybrid_recorded_*` at the retriever's recorded weight (what it ranks with).
        hybrid_ranks, tuned = cross_fitted_ranks(candidates, self.gold)
        tuned_ranks = fused_gold_ranks(convex_fusion(candidates, tuned), candidates, self.gold)
        at_weight = tuned_ranks  # rankings.jsonl: at the weight the retriever ranks with
        rrf_ranks = fused_gold_ranks(reciprocal_rank_fusion(candidates), candidates, self.gold)
        metrics = retrieval_metrics(ranks)
        metrics["in_batch_avg_rank"] = self.in_batch_rank(q_emb, vectors, bare)
        kinds = [("bm25", lex_ranks), ("hybrid", hybrid_ranks), ("rrf", rrf_ranks), ("hybrid_tuned", tuned_ranks)]
        if self.recorded_weight is not None:
            at_weight = fused_gold_ranks(convex_fusion(candidates, self.recorded_weight), candidates, self.gold)
            kinds.append(("hybrid_recorded", at_weight))
            metrics["hybrid_recorded_dense_weight"] = self.recorded_weight
        for kind, r in kinds:
            metrics.update({f"{kind}_{k}": v for k, v in retrieval_metrics(r).items()})
        metrics["hybrid_tuned_dense_weight"] = tuned
        rankings = [{"id": q["id"], "question": q["question"], "gold_rank": int(r), "bm25_gold_rank": int(b),
                     "hybrid_gold_rank": int(h), "rrf_gold_rank": int(f),
                     "top20": [corpus[j]["passage_id"] or corpus[j]["text"][:80] for j in t[:20] if j >= 0]}
                    for q, r, b, h, f, t in zip(dev, ranks, lex_ranks, at_weight, rrf_ranks, dense_i)]
        return {"metrics": metrics, "rankings": rankings}

    def _warn_nan(self, q_emb, vectors: list[Vectors]) -> None:
        # the vectors embedded now (an index's were checked when it was built)
        local = np.array([sum(int(v.embeddings.isnan().any(1).sum()) for v in vectors
                              if isinstance(v.embeddings, torch.Tensor))])
        bad_passages = int(summed_counts(local, self.accelerator.device)[0])
        bad_questions = int(q_emb.isnan().any(1).sum())
        if bad_questions or bad_passages:
            logger.warning("NaN embeddings of %d dev questions and %d corpus texts (a diverged encoder?): their scores "
                           "rank last", bad_questions, bad_passages)

    def in_batch_rank(self, q_emb: torch.Tensor, vectors: list[Vectors], bare) -> float:
        """Haystack's in-batch metric: the positive's rank among the passages of its training-style global batch
        (the batch's positives and hard negatives, each scored by its best window), averaged over dev questions."""
        device = q_emb.device
        extra = None
        if self.extra_tokens is not None:
            extra = Vectors(encode_texts(bare, self.extra_tokens, "passage", self.p_pad,
                                         self.batch_size, device),
                            self.extra_owner if self.encoders.window_sentences else None)
        bs, ranks = self.train_batch_size * self.accelerator.num_processes, []
        dev, question_passages = self.data.questions, self.data.question_passages
        for s in range(0, len(dev), bs):
            ctxs = [c for group in question_passages[s:s + bs] for c in group]
            in_corpus, in_extra = zip(*(self.in_batch_ids[passage_key(c)] for c in ctxs))
            rows = len(dev[s:s + bs])
            corpus_ids = np.tile([-1 if i is None else i for i in in_corpus], (rows, 1))
            scores = score_shards(q_emb[s:s + bs], vectors, corpus_ids, distributed=True)
            if extra is not None:
                extra_ids = np.tile([-1 if i is None else i for i in in_extra], (rows, 1))
                scores = np.maximum(scores, score_passages(q_emb[s:s + bs], extra, extra_ids))
            keys = torch.tensor([key_hash(passage_key(c)) for c in ctxs])
            ranks.append(batch_ranks(torch.from_numpy(scores), keys).float())
        return float(torch.cat(ranks).mean())


def _padded(lists: list[list[int]]) -> np.ndarray:
    width = max((len(x) for x in lists), default=0)
    return np.array([x + [-1] * (width - len(x)) for x in lists], dtype=np.int64).reshape(len(lists), width)
