"""The DPR retriever as a task of the shared training loop (utils.loop.task). One training step, top to bottom:

1. `model_inputs`: the loader yields question indices; `TrainingData.batch` (utils.retriever.training_batches) turns
   them into the tokenised questions, their passages laid out question by question ([positive, negatives...,
   reader's passages...] each) and the passages' keys;
2. `compute_loss`: the bi-encoder embeds both sides (utils.retriever.bi_encoder) and `global_loss`
   (utils.retriever.loss) scores every question against every positive and negative of the global batch, gathered
   across processes, duplicates of each positive masked; with --reader, the KL between the reader's distribution
   over each question's top passages and the retriever's is mixed in (`reader_kl`, utils.retriever.reader_targets);
3. `train_step`: with --grad_cache_chunk_size the same step in chunks (utils.loop.grad_cache).

Around it: negatives refreshed by the model being trained (ANCE-style, at epoch starts and every N updates; with
--reader also each question's top passages and the reader's readings of them), the evaluation
(utils.retriever.evaluation) and the outputs (sentence-transformers and transformers DPR directories,
rankings.jsonl).
"""

import hashlib
import logging
import os
import time

import numpy as np
import torch
from accelerate.utils import send_to_device

from utils.files.jsonfiles import json_line
from utils.loop.checkpoints import load_weights
from utils.loop.grad_cache import grad_cache_step
from utils.loop.task import Task
from utils.reader.distillation import distillation_kl
from utils.retriever.config import EncoderConfig, LossConfig, NegativesConfig, ReaderDistillationConfig
from utils.retriever.encoding import encode, encode_texts, encoding_loader
from utils.retriever.evaluation import RetrievalEvaluation
from utils.retriever.exports import encoder_state, export_dpr, save_sentence_transformers_dir
from utils.retriever.loss import gather_with_grad, global_loss, world
from utils.retriever.mined_negatives import select_negatives
from utils.retriever.reader_targets import ReaderTargets, top_passages
from utils.retriever.settings import RetrieverSettings
from utils.retriever.training_batches import TrainingData
from utils.runtime.process import bare_model
from utils.search.exact import Vectors, dense_search
from utils.search.fusion import CANDIDATES
from utils.search.ranking import retrieval_metrics
from utils.search.shards import shard

logger = logging.getLogger("qa-amp")


class DPRTask(Task):
    tracker_project = "qa-amp-dpr"
    samples_name = "questions"

    def __init__(self, accelerator, encoders: EncoderConfig, negatives: NegativesConfig, loss: LossConfig,
                 data: TrainingData, evaluation: RetrievalEvaluation, q_tok, p_tok,
                 reader: ReaderDistillationConfig | None = None):
        self.accelerator, self.encoders, self.negatives, self.loss = accelerator, encoders, negatives, loss
        self.data, self.evaluation, self.q_tok, self.p_tok = data, evaluation, q_tok, p_tok
        self.encoding_batch_size = evaluation.batch_size  # embedding without gradients
        self.reader = reader
        self.targets = None if reader is None else ReaderTargets(
            accelerator, reader, [q["question"] for q in data.questions], data.passage_texts, self.encoding_batch_size)
        self.dense_weight = None  # the hybrid's, of the latest evaluation: what the weights saved next rank with
        if negatives.refresh_negatives_every:  # the training questions to mine for, and this process's passages
            self.train_question_loader = encoding_loader(accelerator, data.question_tokens, "query", data.q_pad,
                                                         self.encoding_batch_size)
            self.refresh_shard = shard(len(data.passages), accelerator.process_index, accelerator.num_processes)

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
        if not self.negatives.refresh_negatives_every:
            return []
        return [self.data] + ([self.targets] if self.targets is not None else [])

    def model_inputs(self, batch):
        return send_to_device(self.data.batch(batch.cpu().numpy()), self.accelerator.device)

    def compute_loss(self, model, batch):
        q, p = model(query=batch["query"], passage=batch["passage"])
        return self._loss(q, p, batch["passage_keys"], batch.get("reader_scores"))

    def _loss(self, q, p, passage_keys, reader_scores=None):
        """(loss to backpropagate, loss to log): the global-batch loss, scaled by the world size for DDP's
        gradient average (utils.retriever.loss.global_loss); with --reader, (1 - w) x it + w x `reader_kl`."""
        if reader_scores is None:
            loss, for_backward = global_loss(q, p, passage_keys, self.loss.temperature)
            return for_backward, loss
        per_question = len(p) // len(q)
        own = self.data.own
        p = p.view(len(q), per_question, -1)
        keys = passage_keys.view(len(q), per_question)[:, :own].reshape(-1)
        loss, _ = global_loss(q, p[:, :own].reshape(-1, p.shape[-1]), keys, self.loss.temperature)
        w = self.reader.distillation_weight
        loss = (1 - w) * loss + w * self.reader_kl(q, p[:, own:], reader_scores)
        return loss * world()[0], loss

    def reader_kl(self, q, p, reader_scores):
        """KL(softmax(reader_scores / T) || softmax(q . p / temperature)) per question over its top passages (`p`:
        questions x N x dim; a -inf reader score is no passage), the mean over the global batch (every process's
        questions; the gradient reaches this process's, as global_loss's does)."""
        scores = torch.einsum("qd,qnd->qn", q, p) / self.loss.temperature
        allowed = torch.isfinite(reader_scores)
        kl = distillation_kl(scores, reader_scores / self.reader.distillation_temperature, allowed, 1.0)
        return gather_with_grad(kl.reshape(1)).mean()

    def train_step(self, accelerator, model, batch, weight=1.0):
        if not self.loss.grad_cache_chunk_size:
            return super().train_step(accelerator, model, batch, weight)
        # GradCache: the same step in chunks of --grad_cache_chunk_size questions (with their passages).
        batch = self.model_inputs(batch)
        n_q, size = len(batch["query"]["input_ids"]), self.loss.grad_cache_chunk_size
        per_question = len(batch["passage"]["input_ids"]) // n_q
        take = lambda inputs, a, b: {k: v[a:b] for k, v in inputs.items()}  # noqa: E731
        chunks = [{"query": take(batch["query"], s, s + size),
                   "passage": take(batch["passage"], s * per_question, (s + size) * per_question)}
                  for s in range(0, n_q, size)]
        return grad_cache_step(accelerator, model, chunks, lambda m, chunk: m(**chunk),
                               lambda q, p: self._loss(q, p, batch["passage_keys"], batch.get("reader_scores")),
                               weight)

    # --- refreshed hard negatives (ANCE-style) ---

    def start_epoch(self, model, epoch: int) -> None:
        if self.negatives.refresh_negatives_every:
            self.refresh_negatives(model, f"epoch {epoch} start")

    def after_update(self, model, step: int) -> None:
        every = self.negatives.refresh_negatives_every
        if every and step % every == 0:
            self.refresh_negatives(model, f"update {step}")

    def refresh_negatives(self, model, when: str) -> None:
        """Re-mine every training question's hard negatives with the model being trained: each process encodes its
        shard of the training passages and searches it for every training question (utils.search.exact), the
        shards' rankings are merged, and every process keeps the same best-ranked passages that are neither a
        positive nor answer-bearing (utils.retriever.mined_negatives): the same negatives everywhere, no process ranking
        for the others."""
        t0 = time.perf_counter()
        acc, device = self.accelerator, self.accelerator.device
        model.eval()
        with torch.no_grad():
            q = encode(acc, model, self.train_question_loader, "query", len(self.data.question_tokens)).to(device)
            mine = self.refresh_shard
            p = encode_texts(bare_model(acc, model), self.data.passage_tokens, "passage", self.data.p_pad,
                             self.encoding_batch_size, device, rows=np.arange(mine.start, mine.stop))
        own = self.data.own
        old = self.data.question_passages[:, 1:own].copy()
        # deep enough to skip positives and false negatives, and a passage's other windows
        depth = min(len(self.data.passages), 4 * max(old.shape[1], self.data.reader_passages) + 50)
        _, ranked, _ = dense_search(q, Vectors(p, None, len(mine), mine.start), depth)
        new = select_negatives(ranked, self.data.questions, self.data.passages, old.shape[1], old,
                               self.data.normalized_texts)
        self.data.question_passages[:, 1:own] = new
        reading = {}
        if self.targets is not None:  # the reader's passages: the top ones, whatever they hold
            keys = self.data.keys.numpy()
            units, valid = top_passages(ranked, keys, self.data.reader_passages)
            self.data.question_passages[:, own:] = units
            self.data.reader_scores, reading = self.targets.scores(units, valid, keys)
        changed = int(sum(len(set(n) - set(o)) for n, o in zip(new.tolist(), old.tolist())))
        # Which negatives, not only how many changed: two runs agree on a refresh iff their fingerprints agree.
        fingerprint = hashlib.blake2b(np.ascontiguousarray(new, dtype=np.int64).tobytes(), digest_size=6).hexdigest()
        seconds = round(time.perf_counter() - t0, 1)
        logger.info("refreshed hard negatives (%s): %d of %d changed (fingerprint %s); %d passages encoded, "
                    "%.1f s%s", when, changed, old.size, fingerprint, len(self.data.passages), seconds,
                    f"; the reader read {reading['read']} (question, passage) pairs in {reading['read_seconds']} s"
                    if reading else "")
        self.data.refreshes.append({"when": when, "changed": changed, "of": int(old.size), "fingerprint": fingerprint,
                                    "seconds": seconds, **reading})
        self.accelerator.log({"train/negatives_changed": changed})

    # --- evaluation, saving ---

    def evaluate(self, model) -> dict:
        result = self.evaluation(model)
        self.dense_weight = result["metrics"]["hybrid_tuned_dense_weight"]  # tuned on all dev: the one to record
        return result

    def headline(self, m: dict) -> str:
        return (f"top1 {m['top1']:.1f} top5 {m['top5']:.1f} top20 {m['top20']:.1f} MRR@10 {m['mrr@10']:.3f} "
                f"mean rank {m['mean_rank']:.1f} in-batch avg rank {m['in_batch_avg_rank']:.2f} | BM25 top1 "
                f"{m['bm25_top1']:.1f} MRR@10 {m['bm25_mrr@10']:.3f} | hybrid cross-fitted top1 {m['hybrid_top1']:.1f} "
                f"MRR@10 {m['hybrid_mrr@10']:.3f} (at the dense weight tuned on all of dev, "
                f"{m['hybrid_tuned_dense_weight']:.2f}, recorded: top1 {m['hybrid_tuned_top1']:.1f}, an upper bound) "
                f"| RRF top1 {m['rrf_top1']:.1f}")

    def write_outputs(self, directory, result):
        with open(os.path.join(directory, "rankings.jsonl"), "w") as f:
            f.writelines(json_line(r) + "\n" for r in result["rankings"])

    def summary(self, result):
        e = self.encoders
        out = {"pooling": e.pooling, "similarity": e.similarity, "temperature": self.loss.temperature,
               "window_sentences": e.window_sentences, "corpus_passages": len(self.evaluation.data.passages)}
        if self.negatives.refresh_negatives_every:
            out["negatives_refreshed"] = self.data.refreshes
        if self.targets is not None:
            out["reader"] = self.targets.record()
        return out

    def save(self, model, directory, state_dict):
        e = self.encoders
        for side, tok in (("query", self.q_tok), ("passage", self.p_tok)):
            max_len = e.max_query_length if side == "query" else e.max_passage_length
            save_sentence_transformers_dir(model.encoder(side), encoder_state(model, state_dict, side), tok,
                                           os.path.join(directory, f"{side}_encoder"), e.pooling,
                                           e.similarity == "cosine", max_len)
            if e.export_dpr:
                export_dpr(model.encoder(side), encoder_state(model, state_dict, side), tok,
                           os.path.join(directory,
                                        "dpr_question_encoder" if side == "query" else "dpr_context_encoder"),
                           side)
        RetrieverSettings.from_configs(
            e, self.loss, hybrid_dense_weight=self.dense_weight, hybrid_candidates=CANDIDATES,
            hybrid_tuned_on={"data": self.evaluation.config.validation_file,
                             "questions": len(self.evaluation.data.questions)},
            precision=self.accelerator.mixed_precision).save(directory)

    def load(self, model, directory):
        for side in ("query", "passage"):
            load_weights(model.encoder(side), os.path.join(directory, f"{side}_encoder", "model.safetensors"))
