"""The training data of a reader trained with shared normalization (train_reader.py --passages_per_question M):
each training question with its own paragraph and M - 1 of its retrieved passages (utils.reader.passages), every
(question, passage) pair tokenised once into windows; a batch is a list of questions, laid out as all the windows of
all their passages (utils.reader.shared_norm.group_batch)."""

import numpy as np

from utils.reader.config import WindowConfig
from utils.reader.passages import drawn, passage_pools, pool_depth, ranked_passages
from utils.reader.shared_norm import group_batch
from utils.reader.windows_cache import tokenize_windows
from utils.runtime.process import main_process_result


class QuestionGroups:
    """Per training question: its paragraph (pair 0 of its pairs, its labelled answer the target) and its pool of
    retrieved passages; which of the pool it reads in an epoch is `drawn` from (seed, epoch, question). The pools
    are ranked once (utils.reader.passages.ranked_passages) and pooled by the main process, and shared with the
    others."""

    def __init__(self, accelerator, tokenizer, window_config: WindowConfig, examples: list[dict], passages,
                 passages_per_question: int, seed: int, rank=None):
        """`passages`: the corpus; `passages_per_question`: the question's own paragraph and the retrieved passages
        it reads each epoch, drawn with `seed`; `rank`: how the corpus is ranked (utils.reader.passages)."""
        self.passages_per_question, self.seed, self.pad = passages_per_question, seed, tokenizer.pad_token_id
        self.count = passages_per_question - 1  # retrieved passages read with each question in an epoch
        # BM25 ranks on the main process alone (every process would hold it over the whole corpus to rank its share of
        # the questions); a trained retriever's index is searched by every process, each its shards
        ranked = ranked_passages(accelerator, examples, passages, pool_depth(self.count), rank)
        self.pools = main_process_result(accelerator, lambda: passage_pools(examples, passages, ranked, self.count))
        self.answerable = [bool(ex["answers"]["text"]) for ex in examples]
        pairs, self.first_pair = [], []
        for q, (ex, pool) in enumerate(zip(examples, self.pools)):
            self.first_pair.append(len(pairs))
            a = ex["answers"]
            gold = [[a["answer_start"][0], a["answer_start"][0] + len(a["text"][0])]] if a["text"] else []
            pairs.append({"id": f"{ex['id']}#0", "question": ex["question"], "context": ex["context"], "spans": gold})
            for k, entry in enumerate(pool, 1):
                pairs.append({"id": f"{ex['id']}#{k}", "question": ex["question"],
                              "context": passages[entry["passage"]]["text"],
                              "spans": [list(s) for s in entry["spans"]]})
        for i, p in enumerate(pairs):
            p["pair"] = i
        self.windows = tokenize_windows(accelerator, tokenizer, pairs, window_config, labels="spans")
        pair_of_row = np.asarray(self.windows["pair"], dtype=np.int64)
        self.rows_start = np.searchsorted(pair_of_row, np.arange(len(pairs) + 1))  # pair p: rows_start[p:p+2]
        self.row_lengths = np.asarray([len(x) for x in self.windows["input_ids"]], dtype=np.int64)

    def __len__(self):
        return len(self.first_pair)

    def pairs_read(self, question: int, epoch: int) -> list[int]:
        """The pairs question `question` reads in `epoch`: its paragraph, then the drawn passages."""
        first = self.first_pair[question]
        return [first] + [first + 1 + k for k in drawn(self.pools, self.count, self.seed, epoch, question)]

    def rows(self, question: int, epoch: int) -> list[int]:
        return [r for p in self.pairs_read(question, epoch) for r in range(self.rows_start[p], self.rows_start[p + 1])]

    def lengths(self, epoch: int) -> np.ndarray:
        """Per question the longest window it reads in `epoch`: what length grouping sorts by, since a batch pads
        every window to its longest (the question's own paragraph alone would leave the drawn passages, which come
        in every length, to pad each batch at random)."""
        return np.asarray([self.row_lengths[self.rows(q, epoch)].max() for q in range(len(self))])

    def batch(self, questions, epoch: int) -> dict:
        rows, groups = [], []
        for g, q in enumerate(questions):
            mine = self.rows(int(q), epoch)
            rows += mine
            groups += [g] * len(mine)
        answerable = [self.answerable[int(q)] for q in questions]
        return group_batch(self.windows.select(rows).to_list(), groups, answerable, self.pad)

    def tokens(self, questions, epoch: int) -> int:
        return int(sum(self.row_lengths[self.rows(int(q), epoch)].sum() for q in questions))
