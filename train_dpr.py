"""Train a DPR retriever (question encoder + passage encoder) with Accelerate-managed mixed precision.

Runbook (from the repository root, after `pip install -r requirements.txt`):

  python train_dpr.py
      Offline demo: both encoders start from the packaged MiniLM, trained on the shipped DPR sample
      (data/sample/dpr_*.json, made from the reader sample by `python -m utils.make_dpr_data`), CPU,
      about two minutes. Prints top-k accuracy and MRR@10 before and after training.

  accelerate launch train_dpr.py --train_file train.json --validation_file dev.json --passages corpus.jsonl \
      --query_model_name_or_path bert-base-uncased --passage_model_name_or_path bert-base-uncased \
      --mixed_precision fp16 --per_device_train_batch_size 32 --num_hard_negatives 1 --export_dpr
      DPR JSON as in facebookresearch/DPR and Haystack 1.x. Under DDP every question sees every passage of
      the global batch as a negative; --grad_cache_chunk_size N trains a large batch in small memory.

  python train_dpr.py --train_file ../shared/data/dpr/train.json --validation_file ../shared/data/dpr/dev.json \
      --passages ../shared/data/dpr/passages.jsonl --mixed_precision bf16 --output_dir outputs/dpr-squad
      The real-data result in the README.

Skeleton (same as train_reader.py): setup -> data -> model -> fit -> validate. The output directory holds
query_encoder/ and passage_encoder/ (each loads in SentenceTransformer(dir) and AutoModel), with
--export_dpr also dpr_question_encoder/ and dpr_context_encoder/, plus eval_results.json, rankings.jsonl
(per-question top passages) and train_log.jsonl.
"""

import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np
import torch
from accelerate.utils import DistributedType, broadcast, send_to_device
from torch.utils.data import DataLoader
from transformers import AutoTokenizer

from utils.args import TrainArgs, arg, check_max_length, packaged_minilm, parse_args
from utils.batching import LengthGroupedBatchSampler
from utils.bi_encoder import (BiEncoder, encoder_state, export_dpr, save_sentence_transformers_dir,
                              sentence_transformers_defaults)
from utils.bm25 import BM25, reciprocal_rank_fusion
from utils.dpr_data import (Tokenized, evaluation_corpus, key_hash, load_dpr, load_passages, passage_key,
                            select_negatives, training_passages)
from utils.dpr_loss import dpr_loss, global_loss, grad_cache_step
from utils.errors import UserError, exit_on_user_error
from utils.retrieval_metrics import gold_ranks, retrieval_metrics, top_passages
from utils.runtime import finish, full_state_dict, publish_dir, setup, write_json
from utils.training import (Task, build_optimizer, build_scheduler, evaluate_before_training, fit, load_weights,
                            plan_steps, run_summary)

logger = logging.getLogger("qa-amp")
SAMPLE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "sample")


@dataclass
class DPRArgs(TrainArgs):
    query_model_name_or_path: str = arg(packaged_minilm(), "Question encoder to start from (default: packaged MiniLM).")
    passage_model_name_or_path: str = arg(packaged_minilm(), "Passage encoder to start from (default: packaged MiniLM).")
    shared_encoder: bool = arg(False, "One encoder for questions and passages (--query_model_name_or_path).")
    pooling: Optional[Literal["cls", "mean"]] = arg(
        None, "Default: what a sentence-transformers starting model was trained with, else 'cls' (DPR).")
    similarity: Optional[Literal["dot", "cosine"]] = arg(
        None, "Default: 'cosine' if the starting model normalises its embeddings, else 'dot' (DPR).")
    temperature: Optional[float] = arg(None, "Logits = similarity / temperature. Default 0.05 for cosine, 1 for dot.")
    embed_title: bool = arg(True, "Encode passages as the pair (title, text) rather than text alone.")
    train_file: Optional[str] = arg(None, "DPR JSON. Default: the shipped sample (data/sample/dpr_train.json).")
    validation_file: Optional[str] = arg(None, "DPR JSON for evaluation. Default: the shipped sample's dev file.")
    passages: Optional[str] = arg(None, "Corpus to rank at evaluation (JSON lines of title/text/passage_id). "
                                        "Default: the sample's corpus on the sample; else every context of the dev file.")
    num_hard_negatives: int = arg(1, "Hard negatives per question (topped up from negative_ctxs, then random).")
    refresh_negatives_every: Optional[int] = arg(
        None, "Every N updates and at each epoch start, re-mine each training question's hard negatives with the "
        "model being trained (ANCE-style): the best-ranked training passages that are neither a positive nor "
        "contain an answer string.")
    group_by_length: bool = arg(False, "Batch questions whose passages have similar lengths (by the longest of each "
                                       "question's first passages). Off: --length_buckets already removes most padding.")
    length_buckets: int = arg(4, "Encode each batch's passages as N sub-batches of similar length, each padded "
                                 "only to its own longest (same embeddings, less padding); 1: one padded batch.")
    grad_cache_chunk_size: Optional[int] = arg(None, "GradCache: questions per forward chunk. The full batch's "
                                               "in-batch negatives at the memory of one chunk.")
    max_query_length: int = arg(64, "Question tokens.")
    max_passage_length: int = arg(256, "Passage tokens (title + text).")
    export_dpr: bool = arg(False, "Also write transformers DPRQuestionEncoder/DPRContextEncoder dirs (Haystack 1.x).")
    output_dir: str = arg("outputs/dpr", "Where the encoders, metrics, rankings and checkpoints go.")
    learning_rate: float = arg(2e-5, "Peak learning rate of AdamW.")
    num_train_epochs: Optional[float] = arg(None, "Training epochs (default 4 on the shipped sample, 2 otherwise).")
    metric_for_best_model: str = arg("mrr@10", "Metric (higher is better) for best-model keeping and early stopping.")
    per_device_train_batch_size: int = arg(16, "Questions per micro-batch per process.")

    def validate(self):
        if self.train_file is None:
            if self.validation_file or self.passages:
                raise UserError("--validation_file/--passages need a --train_file")
            self.train_file = os.path.join(SAMPLE_DIR, "dpr_train.json")
            self.validation_file = os.path.join(SAMPLE_DIR, "dpr_dev.json")
            self.passages = os.path.join(SAMPLE_DIR, "dpr_passages.jsonl")
            if self.num_train_epochs is None:
                self.num_train_epochs = 4.0
        if self.num_train_epochs is None:
            self.num_train_epochs = 2.0
        if not self.validation_file:
            raise UserError("give --validation_file (DPR JSON) to evaluate retrieval")
        if self.num_hard_negatives < 0:
            raise UserError("--num_hard_negatives must be >= 0")
        if self.temperature is not None and self.temperature <= 0:
            raise UserError("--temperature must be positive")
        for name in ("grad_cache_chunk_size", "refresh_negatives_every", "length_buckets"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise UserError(f"--{name} must be at least 1 (got {getattr(self, name)})")
        if self.refresh_negatives_every and self.num_hard_negatives < 1:
            raise UserError("--refresh_negatives_every needs --num_hard_negatives of at least 1")
        if self.shared_encoder and self.passage_model_name_or_path != self.query_model_name_or_path \
                and self.passage_model_name_or_path != packaged_minilm():
            raise UserError("--shared_encoder uses --query_model_name_or_path only; drop --passage_model_name_or_path")
        st_pooling, st_normalize = sentence_transformers_defaults(self.query_model_name_or_path)
        self.pooling = self.pooling or st_pooling or "cls"
        self.similarity = self.similarity or ("cosine" if st_normalize else "dot")
        if self.temperature is None:
            self.temperature = 0.05 if self.similarity == "cosine" else 1.0
        if self.export_dpr and self.pooling != "cls":
            raise UserError("--export_dpr needs --pooling cls: transformers' DPR encoders pool the [CLS] token")
        super().validate()

    def check_distributed(self, distributed_type) -> None:
        """Combinations the hardware layout makes wrong, refused before anything trains."""
        if self.grad_cache_chunk_size and distributed_type == DistributedType.DEEPSPEED:
            # Accelerate's DeepSpeed backward also steps the engine on sync steps, and GradCache calls backward
            # once per chunk: the optimizer would step once per chunk on partial gradients (and ZeRO-2
            # ignores no_sync).
            raise UserError("--grad_cache_chunk_size does not work under DeepSpeed (the engine would step once per "
                            "chunk); use DDP or FSDP, or a smaller --per_device_train_batch_size without GradCache")


# --- data ------------------------------------------------------------------------------------------

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
        self.passages, index = [], {}
        for c in ctxs:
            if passage_key(c) not in index:
                index[passage_key(c)] = len(self.passages)
                self.passages.append(c)
        self.groups = np.array([[index[passage_key(c)] for c in g] for g in groups], dtype=np.int64)
        self.keys = torch.tensor([key_hash(passage_key(c)) for c in self.passages], dtype=torch.long)
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


# --- the task the shared loop trains -----------------------------------------------------------------

class DPRTask(Task):
    tracker_project = "qa-amp-dpr"

    def __init__(self, accelerator, args, q_tok, p_tok, train, data: TrainingData, dev, corpus, dev_passages):
        self.accelerator, self.args, self.q_tok, self.p_tok = accelerator, args, q_tok, p_tok
        self.train, self.data = train, data
        self.dev, self.corpus, self.dev_passages = dev, corpus, dev_passages
        self.corpus_index = {passage_key(c): i for i, c in enumerate(corpus)}
        self.gold = [[self.corpus_index[passage_key(c)] for c in q["positive_ctxs"]] for q in dev]
        bs = args.per_device_eval_batch_size
        self.corpus_loader = encoding_loader(accelerator, tokenize_passages(p_tok, corpus, args), "passage",
                                             p_tok.pad_token_id, bs)
        self.question_loader = encoding_loader(accelerator, tokenize_questions(q_tok, [q["question"] for q in dev], args),
                                               "query", q_tok.pad_token_id, bs)
        if args.refresh_negatives_every:  # the training questions and passages, to mine negatives from
            self.train_passage_loader = encoding_loader(accelerator, data.p, "passage", data.p_pad, bs)
            self.train_question_loader = encoding_loader(accelerator, data.q, "query", data.q_pad, bs)
        # BM25 over the same corpus, scored once: the baseline each evaluation compares the dense ranking with,
        # and the lexical half of the hybrid (reciprocal-rank fusion of the two rankings).
        self.bm25_scores = BM25(corpus).scores([q["question"] for q in dev])
        self.bm25_ranks = gold_ranks(self.bm25_scores, self.gold)

    @property
    def metric_names(self) -> list[str]:
        names = list(retrieval_metrics(np.ones(1, dtype=np.int64)))
        return names + ["in_batch_avg_rank"] + [f"{kind}_{n}" for kind in ("bm25", "hybrid") for n in names]

    @staticmethod
    def samples_in(batch):
        return len(batch)  # the loader yields question indices

    def tokens_in(self, batch):
        return self.data.tokens(batch.cpu().numpy())

    def checkpoint_objects(self) -> list:
        return [self.data] if self.args.refresh_negatives_every else []

    def train_step(self, accelerator, model, batch, weight=1.0):
        batch = send_to_device(self.data.batch(batch.cpu().numpy()), accelerator.device)
        if self.args.grad_cache_chunk_size:
            return grad_cache_step(accelerator, model, batch["query"], batch["passage"], batch["passage_keys"],
                                   self.args.temperature, self.args.grad_cache_chunk_size, weight)
        q, p = model(query=batch["query"], passage=batch["passage"])
        loss, for_backward, _ = global_loss(q, p, batch["passage_keys"], self.args.temperature)
        accelerator.backward(for_backward * weight)
        return loss.detach()

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
            new = torch.from_numpy(select_negatives(ranked.numpy(), self.train, self.data.passages, old.shape[1], old))
        new = broadcast(new.to(self.accelerator.device), from_process=0).cpu().numpy()
        self.data.groups[:, 1:] = new
        changed = int(sum(len(set(n) - set(o)) for n, o in zip(new.tolist(), old.tolist())))
        seconds = round(time.perf_counter() - t0, 1)
        logger.info("refreshed hard negatives (%s): %d of %d changed; %d passages encoded (%.1f MiB of embeddings), "
                    "%.1f s", when, changed, old.size, len(p), p.numel() * p.element_size() / 2**20, seconds)
        self.data.refreshes.append({"when": when, "changed": changed, "of": int(old.size), "seconds": seconds})
        self.accelerator.log({"train/negatives_changed": changed})
        model.train()

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
        p_emb = self.encode(model, self.corpus_loader, "passage", len(self.corpus))
        q_emb = self.encode(model, self.question_loader, "query", len(self.dev))
        scores = (q_emb @ p_emb.T).numpy()
        ranks = gold_ranks(scores, self.gold)
        hybrid_ranks = gold_ranks(reciprocal_rank_fusion(scores, self.bm25_scores), self.gold)
        metrics = retrieval_metrics(ranks)
        metrics["in_batch_avg_rank"] = self._in_batch_rank(q_emb, p_emb)
        for kind, r in (("bm25", self.bm25_ranks), ("hybrid", hybrid_ranks)):
            metrics.update({f"{kind}_{k}": v for k, v in retrieval_metrics(r).items()})
        top = top_passages(scores, 20)
        rankings = [{"id": q["id"], "question": q["question"], "gold_rank": int(r), "bm25_gold_rank": int(b),
                     "hybrid_gold_rank": int(h),
                     "top20": [self.corpus[j]["passage_id"] or self.corpus[j]["text"][:80] for j in t]}
                    for q, r, b, h, t in zip(self.dev, ranks, self.bm25_ranks, hybrid_ranks, top)]
        return {"metrics": metrics, "rankings": rankings}

    def _in_batch_rank(self, q_emb, p_emb) -> float:
        """Haystack's in-batch metric: the positive's rank among the passages of its training-style global
        batch (the batch's positives and hard negatives), averaged over dev questions."""
        bs, ranks = self.args.per_device_train_batch_size * self.accelerator.num_processes, []
        for s in range(0, len(self.dev), bs):
            ctxs = [c for group in self.dev_passages[s:s + bs] for c in group]
            p = p_emb[[self.corpus_index[passage_key(c)] for c in ctxs]]
            keys = torch.tensor([key_hash(passage_key(c)) for c in ctxs])
            ranks.append(dpr_loss(q_emb[s:s + bs], p, keys, 1.0)[1].float())
        return float(torch.cat(ranks).mean())

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


@exit_on_user_error
def main(argv=None):
    # --- setup ---------------------------------------------------------------------------------------
    args = parse_args(DPRArgs, argv)
    accelerator = setup(args)
    args.check_distributed(accelerator.distributed_type)
    accelerator.print(f"encoders: pooling={args.pooling} similarity={args.similarity} temperature={args.temperature} "
                      f"{'shared' if args.shared_encoder else 'separate'} hard_negatives={args.num_hard_negatives}")

    # --- data ----------------------------------------------------------------------------------------
    try:
        q_tok = AutoTokenizer.from_pretrained(args.query_model_name_or_path)
        p_tok = q_tok if args.shared_encoder else AutoTokenizer.from_pretrained(args.passage_model_name_or_path)
    except (OSError, ValueError) as err:
        raise UserError(f"cannot load a tokenizer ({str(err).splitlines()[0]})") from None
    check_max_length(args.query_model_name_or_path, q_tok, max_query_length=args.max_query_length)
    check_max_length(args.query_model_name_or_path if args.shared_encoder else args.passage_model_name_or_path, p_tok,
                     max_passage_length=args.max_passage_length)
    train = load_dpr(args.train_file)
    dev = load_dpr(args.validation_file)
    if args.max_train_samples:
        train = train[: args.max_train_samples]
    if args.max_eval_samples:
        dev = dev[: args.max_eval_samples]
    corpus, added = evaluation_corpus(dev, load_passages(args.passages) if args.passages else None)
    if added:
        logger.warning("%d gold passages of the dev file are not in %s; added them to the ranked corpus", added,
                       args.passages)
    per_question = training_passages(train, args.num_hard_negatives, args.seed)
    dev_passages = training_passages(dev, args.num_hard_negatives, args.seed)
    corpus, _ = evaluation_corpus(dev, corpus + [c for g in dev_passages for c in g])  # in-batch rank needs them
    logger.info("train: %d questions x (1 positive + %d negatives); dev: %d questions; corpus: %d passages",
                len(train), args.num_hard_negatives, len(dev), len(corpus))
    if len(train) < args.per_device_train_batch_size * accelerator.num_processes:
        raise UserError(f"{args.train_file}: {len(train)} questions are fewer than one global batch "
                        f"({args.per_device_train_batch_size} x {accelerator.num_processes} processes)")

    data = TrainingData(train, per_question, q_tok, p_tok, args, mining=bool(args.refresh_negatives_every))
    # Length grouping by each question's longest passage (as first chosen: the sampler's order must not move when
    # a refresh changes the negatives, or a resumed run would not see the batches it missed). Under DDP,
    # Accelerate completes the epoch's last round from the epoch's first questions, so every process's batches
    # are full (the shapes gathered across processes match) and no question is left out.
    batch_sampler = LengthGroupedBatchSampler(data.p.lengths[data.groups].max(1), args.per_device_train_batch_size,
                                              args.seed, group_by_length=args.group_by_length)
    train_loader = DataLoader(list(range(len(train))), batch_sampler=batch_sampler, collate_fn=torch.tensor,
                              generator=torch.Generator().manual_seed(args.seed))  # see train_reader.py

    # --- model ---------------------------------------------------------------------------------------
    try:
        model = BiEncoder.from_pretrained(args.query_model_name_or_path, args.passage_model_name_or_path,
                                          args.shared_encoder, args.pooling, args.similarity == "cosine",
                                          args.length_buckets)
    except (OSError, ValueError) as err:
        raise UserError(f"cannot load an encoder ({str(err).splitlines()[0]})") from None
    if args.export_dpr and model.query_encoder.config.model_type != "bert":
        raise UserError(f"--export_dpr needs BERT-architecture encoders (got {model.query_encoder.config.model_type})")
    optimizer = build_optimizer(model, args, accelerator.device)
    model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
    plan = plan_steps(args, train_loader)  # from the prepared loader: this process's real share
    scheduler = build_scheduler(optimizer, args, plan.total_updates)
    task = DPRTask(accelerator, args, q_tok, p_tok, train, data, dev, corpus, dev_passages)
    task.check_metric_for_best_model(args.metric_for_best_model)

    before = evaluate_before_training(accelerator, args, task, model, _headline)

    # --- fit -----------------------------------------------------------------------------------------
    state, final = fit(accelerator, args, task, model, optimizer, scheduler, train_loader, plan)

    # --- validate and publish ------------------------------------------------------------------------
    accelerator.print("after training:  " + _headline(final["metrics"]))
    state_dict = full_state_dict(accelerator, model)  # every process: gathers FSDP/DeepSpeed shards
    with publish_dir(accelerator, args.output_dir) as tmp:
        if accelerator.is_main_process:
            task.save(accelerator.unwrap_model(model), tmp, state_dict)
    summary = run_summary(accelerator, optimizer, plan, state, final, before, "questions")
    summary.update(pooling=args.pooling, similarity=args.similarity, temperature=args.temperature)
    if args.refresh_negatives_every:
        summary["negatives_refreshed"] = data.refreshes
    write_json(accelerator, os.path.join(args.output_dir, "eval_results.json"), summary)
    if accelerator.is_main_process:
        with open(os.path.join(args.output_dir, "rankings.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in final["rankings"])
    accelerator.print(f"saved encoders, eval_results.json and rankings.jsonl to {args.output_dir} "
                      f"({summary['train_questions_per_second']} questions/s, {state.skipped_steps} skipped updates)")
    finish(accelerator)


def _headline(m: dict) -> str:
    return (f"top1 {m['top1']:.1f} top5 {m['top5']:.1f} top20 {m['top20']:.1f} MRR@10 {m['mrr@10']:.3f} "
            f"mean rank {m['mean_rank']:.1f} in-batch avg rank {m['in_batch_avg_rank']:.2f} | BM25 top1 "
            f"{m['bm25_top1']:.1f} MRR@10 {m['bm25_mrr@10']:.3f} | hybrid (RRF) top1 {m['hybrid_top1']:.1f} "
            f"MRR@10 {m['hybrid_mrr@10']:.3f}")


if __name__ == "__main__":
    main()
