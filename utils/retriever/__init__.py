"""The DPR retriever: data, sentence windows, the bi-encoder, its loss and task, negative mining, the search engine,
BM25 and hybrids, evaluation, and the trained retriever's API.

    from utils.retriever import Index, Retriever      # utils.retriever.index
"""


def __getattr__(name):  # the API on first use: importing the package for its modules stays light
    if name in ("Index", "Retriever"):
        from utils.retriever import index

        return getattr(index, name)
    raise AttributeError(name)
