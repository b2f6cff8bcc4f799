"""An index of a corpus, on disk and in memory: its format and versions (format.py), the Index that holds vectors in
shards, the passages and BM25, saves and loads them (index.py), the build by every process from any passage
encoder (writer.py, over the corpus checked and cut into chunks in corpus_check.py), the update that keeps the
vectors of unchanged passages (update.py), FAISS indexes from its shards (faiss_index.py). It ranks with
utils.search and knows no model: a retriever (utils.retriever) encodes and hands it vectors."""
