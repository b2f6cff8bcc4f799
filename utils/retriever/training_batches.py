"""The DPR retriever's training data and loader: each question's passages ([positive, hard negatives...], and with
--reader the top passages the reader reads), tokenised once, and batches of question indices; the negatives a
refresh replaces travel with the checkpoint (`state_dict`)."""

import logging

import numpy as np
import torch
from torch.utils.data import DataLoader

from utils.files.answers import normalized
from utils.files.corpus import key_hash, passage_key, text_key, unique_passages
from utils.files.dpr import load_dpr, training_passages
from utils.retriever.config import EncoderConfig, NegativesConfig
from utils.retriever.encoding import tokenize_passages, tokenize_questions
from utils.retriever.sentence_windows import training_windows
from utils.runtime.batching import LengthGroupedBatchSampler

logger = logging.getLogger("qa-amp")


class TrainingData:
    """The training questions and the passages they train against, tokenised once. Built from `question_passages`,
    each question's [positive, negatives...] (utils.files.dpr.training_passages); `self.question_passages[i]` holds
    question i's as indices into `self.passages`. A refresh replaces the negatives; they are checkpointed
    (state_dict), so a resumed run trains on exactly the negatives the interrupted one had. With `refresh`, the
    passages also include every other passage of the train file: the corpus refreshed negatives come from.
    With `reader_passages` N (--reader), each question's row ends with its N top passages (as units: a passage's
    best window), with the reader's log probability of each in `reader_scores` (-inf: none), both set at every
    refresh and checkpointed with the negatives; `passage_texts` holds each passage's whole text by its key hash,
    what the reader reads."""

    def __init__(self, questions: list[dict], question_passages: list[list[dict]], q_tok, p_tok,
                 encoders: EncoderConfig, refresh: bool, reader_passages: int = 0,
                 passage_texts: dict[int, str] | None = None):
        self.questions = questions
        ctxs = [c for g in question_passages for c in g]
        if refresh:
            ctxs += [c for q in questions for c in q["positive_ctxs"] + q["hard_negative_ctxs"] + q["negative_ctxs"]]
        self.passages = unique_passages(ctxs)
        position = {text_key(c): i for i, c in enumerate(self.passages)}
        self.question_passages = np.array([[position[text_key(c)] for c in g] for g in question_passages],
                                          dtype=np.int64)
        self.own = self.question_passages.shape[1]  # a question's positive and negatives: what the in-batch loss ranks
        self.reader_passages, self.passage_texts = reader_passages, passage_texts
        if reader_passages:  # until the first refresh (epoch 0's start, before any batch): the positive, no reading
            self.question_passages = np.concatenate(
                [self.question_passages, np.repeat(self.question_passages[:, :1], reader_passages, axis=1)], axis=1)
            self.reader_scores = np.full((len(questions), reader_passages), -np.inf)
        # Masking compares passages, not texts: a window is a duplicate of every other window of its passage.
        self.keys = torch.tensor([key_hash(passage_key(c)) for c in self.passages], dtype=torch.long)
        self.normalized_texts = [normalized(c["text"]) for c in self.passages] if refresh else None
        self.question_tokens = tokenize_questions(q_tok, [q["question"] for q in questions], encoders.max_query_length)
        self.passage_tokens = tokenize_passages(p_tok, self.passages, encoders.max_passage_length, encoders.embed_title)
        self.q_pad, self.p_pad = q_tok.pad_token_id, p_tok.pad_token_id
        self.refreshes = []  # {"when", "changed", "seconds"} per refresh: a record for eval_results.json

    def batch(self, question_indices) -> dict:
        """Tokenised questions, their passages laid out question by question, and the passages' keys. Built when
        the batch is trained on (not when the loader prefetches it), so a refresh applies from the next batch."""
        rows = self.question_passages[question_indices].reshape(-1)
        out = {"query": self.question_tokens.batch(question_indices, self.q_pad),
               "passage": self.passage_tokens.batch(rows, self.p_pad),
               "passage_keys": self.keys[rows]}
        if self.reader_passages:
            out["reader_scores"] = torch.from_numpy(self.reader_scores[question_indices]).float()
        return out

    def tokens(self, question_indices) -> int:
        return int(self.question_tokens.lengths[question_indices].sum()
                   + self.passage_tokens.lengths[self.question_passages[question_indices]].sum())

    def state_dict(self):
        state = {"negatives": torch.from_numpy(self.question_passages[:, 1:].copy()), "refreshes": self.refreshes}
        if self.reader_passages:
            state["reader_scores"] = torch.from_numpy(self.reader_scores.copy())
        return state

    def load_state_dict(self, state):
        self.question_passages[:, 1:] = state["negatives"].numpy()
        self.refreshes = state["refreshes"]
        if self.reader_passages:
            self.reader_scores = state["reader_scores"].numpy().copy()


def load_training_data(train_file: str, max_train_samples: int | None, encoders: EncoderConfig,
                       negatives: NegativesConfig, seed: int, q_tok, p_tok, reader_passages: int = 0) -> TrainingData:
    """The training questions of a DPR file (its first `max_train_samples`) with their first negatives
    (utils.files.dpr.training_passages), tokenised. With window_sentences, each positive is cut to its window that
    holds the answer and the negatives to windows (utils.retriever.sentence_windows). `reader_passages`: room for
    each question's top passages that a reader reads (--reader), and the whole passages' texts it reads."""
    questions = load_dpr(train_file)[:max_train_samples]
    passage_texts = None
    if reader_passages:  # before windows cut them: the reader reads whole passages
        passage_texts = {key_hash(passage_key(c)): c["text"] for q in questions
                         for c in q["positive_ctxs"] + q["hard_negative_ctxs"] + q["negative_ctxs"]}
    if encoders.window_sentences:
        questions, whole = training_windows(questions, encoders.window_sentences)
        logger.info("train: positives are the answer-bearing %d-sentence windows (%d questions keep the whole passage: "
                    "no window holds an answer)", encoders.window_sentences, whole)
    question_passages = training_passages(questions, negatives.num_hard_negatives, seed)
    return TrainingData(questions, question_passages, q_tok, p_tok, encoders,
                        refresh=bool(negatives.refresh_negatives_every), reader_passages=reader_passages,
                        passage_texts=passage_texts)


def training_loader(data: TrainingData, per_device_train_batch_size: int, seed: int,
                    group_by_length: bool) -> DataLoader:
    """The training questions' indices in batches, grouped by length with `group_by_length`: by each question's
    longest passage as first chosen (the sampler's order must not move when a refresh changes the negatives, or a
    resumed run would not see the batches it missed). Under DDP, Accelerate completes the epoch's last round from
    the epoch's first questions, so every process's batches are full (the shapes gathered across processes match)
    and no question is left out."""
    batch_sampler = LengthGroupedBatchSampler(data.passage_tokens.lengths[data.question_passages].max(1),
                                              per_device_train_batch_size, seed, group_by_length)
    # Own generator: creating an iterator must not draw from the global RNG, or a resumed run's dropout masks would
    # differ from an uninterrupted run's.
    return DataLoader(list(range(len(data.questions))), batch_sampler=batch_sampler, collate_fn=torch.tensor,
                      generator=torch.Generator().manual_seed(seed))
