"""Exact k-best selection that does not depend on how the corpus is cut: every (score, passage id) is one int64
key ordered by the score, then by the smaller id, so that equal scores go to the same passage whatever the blocks
of a search or the shards of several processes (utils.search.ranking's rule for ties)."""

import torch


def monotonic(vals: torch.Tensor) -> torch.Tensor:
    """float32 values as int64 in the same order (the float bits, negatives flipped)."""
    bits = vals.float().contiguous().view(torch.int32).long()
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def selection_keys(vals: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """int64 keys ordered by value, then by the smaller id (ids below 2^31): the selection rule as one number."""
    return monotonic(vals) * (1 << 31) + ((1 << 31) - 1 - ids)


LOWEST = torch.iinfo(torch.int64).min
SPAN = 64  # columns whose maximum is checked against the cut before any of them is


def passing(scores: torch.Tensor, cut: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, columns) of the scores at or above their row's cut, grouped by row, columns ascending: what
    `torch.nonzero(scores >= cut[:, None])` gives, for scores without NaN (the search has made them -inf). Once the
    cut is high few scores pass, so each run of SPAN columns is first checked by its maximum (one pass over the
    scores), and only the runs that reach the cut are looked at score by score: not a comparison, a mask and a scan
    of every score."""
    n, width = scores.shape
    runs = width // SPAN
    if runs < 4 or not scores.is_contiguous():
        return torch.nonzero(scores >= cut[:, None], as_tuple=True)
    head = scores[:, :runs * SPAN].view(n, runs, SPAN)
    rr, ss = torch.nonzero(head.amax(2) >= cut[:, None], as_tuple=True)
    pr, pc = torch.nonzero(head[rr, ss] >= cut[rr, None], as_tuple=True)
    r, c = rr[pr], ss[pr] * SPAN + pc
    if runs * SPAN < width:  # the last columns, fewer than SPAN
        tr, tc = torch.nonzero(scores[:, runs * SPAN:] >= cut[:, None], as_tuple=True)
        r, c = torch.cat([r, tr]), torch.cat([c, tc + runs * SPAN])
        order = torch.argsort(r, stable=True)
        r, c = r[order], c[order]
    return r, c


class KBest:
    """The k best passages per query seen so far, kept as selection keys (`selection_keys`) so that equal scores go
    to the smaller id whatever the blocks or shards. Each block's scores are first cut at the query's k-th best so
    far (`floor`; ties stay). What passes the cut waits in a buffer and is merged into the k best only once the
    buffer holds about `merge_at` entries (default: half of n_rows x k): a merge costs a top-k over every touched
    query's k kept entries, and after the first blocks a block adds a few entries per query, so merging after
    every block would cost k per query per block. A floor from an older merge is lower than the current k-th best,
    never higher: it only lets more entries wait. Read `scores`/`ids` after `flush()`."""

    def __init__(self, n_rows: int, k: int, device, merge_at: int | None = None):
        self.k = k
        self.keys = torch.full((n_rows, k), LOWEST, dtype=torch.long, device=device)
        self.scores = torch.full((n_rows, k), float("-inf"), device=device)
        self.ids = torch.full((n_rows, k), -1, dtype=torch.long, device=device)
        self.floor = torch.full((n_rows,), float("-inf"), device=device)
        self.started = False
        self.merge_at = max(1, n_rows * k // 2) if merge_at is None else merge_at
        self.waiting, self.waiting_count = [], 0

    def add(self, scores: torch.Tensor, rows: torch.Tensor, first_id: int) -> None:
        """Take one block's scores of the queries `rows` (scores[i] belongs to query rows[i])."""
        first = not self.started and scores.shape[1] >= self.k and len(rows) == len(self.keys)
        if first:  # the first block's k-th best is a safe cut at once (the final k-th best can only be higher)
            self.floor = scores.topk(self.k, dim=1).values[:, -1]
        self.started = True
        r, cols = passing(scores, self.floor[rows])
        self.add_entries(rows[r], cols + first_id, scores[r, cols])
        if first:
            self.flush()  # the k best of the first block: every later cut is then the k-th best so far

    def add_entries(self, r: torch.Tensor, ids: torch.Tensor, vals: torch.Tensor) -> None:
        """Take scored passages: query r[i] scores passage ids[i] vals[i] (several entries of one query may come
        in any order)."""
        if len(r):
            self.waiting.append((r, ids, vals))
            self.waiting_count += len(r)
            if self.waiting_count >= self.merge_at:
                self.flush()

    def flush(self) -> None:
        """Merge the waiting entries into the k best and raise the floor to each touched query's k-th best."""
        if not self.waiting:
            return
        r, ids, vals = (torch.cat(x) for x in zip(*self.waiting)) if len(self.waiting) > 1 else self.waiting[0]
        self.waiting, self.waiting_count = [], 0
        if not bool((r[1:] >= r[:-1]).all()):
            order = torch.argsort(r, stable=True)  # group the entries by query
            r, ids, vals = r[order], ids[order], vals[order]
        rows, r = torch.unique_consecutive(r, return_inverse=True)
        counts = torch.bincount(r, minlength=len(rows))
        pos = torch.arange(len(r), device=r.device) - (counts.cumsum(0) - counts)[r]
        width = int(counts.max())
        new_keys = torch.full((len(rows), width), LOWEST, dtype=torch.long, device=r.device)
        new_vals = torch.full((len(rows), width), float("-inf"), device=r.device)
        new_ids = torch.full((len(rows), width), -1, dtype=torch.long, device=r.device)
        new_keys[r, pos], new_vals[r, pos], new_ids[r, pos] = selection_keys(vals, ids), vals, ids
        keys = torch.cat([self.keys[rows], new_keys], 1)
        top = keys.topk(self.k, dim=1).indices
        self.keys[rows] = keys.gather(1, top)
        self.scores[rows] = torch.cat([self.scores[rows], new_vals], 1).gather(1, top)
        self.ids[rows] = torch.cat([self.ids[rows], new_ids], 1).gather(1, top)
        full = self.ids[rows, -1] >= 0
        self.floor[rows] = torch.where(full, self.scores[rows, -1], torch.full_like(self.floor[rows], float("-inf")))


def select_k_best(rows: torch.Tensor, ids: torch.Tensor, vals: torch.Tensor, n_rows: int, k: int):
    """Per row, the k best (row, id, value) entries by the selection rule (`selection_keys`): merging the shards'
    results."""
    order = selection_keys(vals, ids).argsort(descending=True, stable=True)
    order = order[rows[order].argsort(stable=True)]
    rows, ids, vals = rows[order], ids[order], vals[order]
    counts = torch.bincount(rows, minlength=n_rows)
    pos = torch.arange(len(rows), device=rows.device) - (counts.cumsum(0) - counts)[rows]
    keep = pos < k
    best_s = vals.new_full((n_rows, k), float("-inf"))
    best_i = torch.full((n_rows, k), -1, dtype=torch.long, device=rows.device)
    best_s[rows[keep], pos[keep]] = vals[keep]
    best_i[rows[keep], pos[keep]] = ids[keep]
    return best_s, best_i
