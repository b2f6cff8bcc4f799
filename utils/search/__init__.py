"""Search: vectors and texts in, rankings out. Exact dense search (exact.py over vectors.py's shards of vectors, with
k-best selection in kbest.py, MaxP over sentence windows in best_window.py, the bf16 prefilter in bf16_prefilter.py
and several processes' shards merged in shards.py), BM25 (bm25.py), fusion of dense and lexical rankings
(fusion.py), ranking metrics (ranking.py) and the hits every API returns (hits.py). It takes query vectors and texts,
never a model, and holds no files: the index on disk is utils.index's."""
