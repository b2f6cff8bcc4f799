"""The DPR retriever: data, sentence windows, the bi-encoder, its loss and task, negative mining, the search engine,
BM25 and hybrids, evaluation, and the trained retriever's API.

    from utils.retriever import Index, Retriever      # utils.search.index, utils.retriever.retriever
"""


def __getattr__(name):  # the API on first use: importing the package for its modules stays light
    if name == "Index":
        from utils.search.index import Index

        return Index
    if name == "Retriever":
        from utils.retriever.retriever import Retriever

        return Retriever
    raise AttributeError(name)
