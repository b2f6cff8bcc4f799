"""Search over a corpus: exact dense search (exact.py, with k-best selection in kbest.py and several processes'
shards in shards.py), an index on disk (index.py, written by index_writer.py in index_format.py's layout), FAISS
(faiss_index.py), BM25 (bm25.py), fusion of dense and lexical rankings (fusion.py) and ranking metrics
(ranking.py). It takes vectors and texts, never a model: encoding questions is the retriever's (utils.retriever)."""
