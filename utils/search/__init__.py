"""Search over a corpus: exact dense search (exact.py over vectors.py's shards of vectors, with k-best selection in
kbest.py, MaxP over sentence windows in best_window.py, the bf16 prefilter in bf16_prefilter.py and several
processes' shards merged in shards.py), an index of a corpus (index.py, on disk in index_format.py's layout), FAISS
(faiss_index.py), BM25 (bm25.py), fusion of dense and lexical rankings (fusion.py) and ranking metrics (ranking.py).
It takes query vectors and texts, never a model: encoding questions and passages is the retriever's
(utils.retriever), which asks an index and writes one (utils.retriever.index_writer)."""
