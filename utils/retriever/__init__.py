"""The DPR retriever: data, sentence windows, the bi-encoder, its loss and task, negative mining, evaluation, and the
trained retriever's API: a Retriever encodes, indexes a corpus and searches an Index (utils.search.index).

    from utils.retriever import Index, Retriever      # utils.search.index, utils.retriever.retriever
"""

from utils.retriever.retriever import Retriever
from utils.search.index import Index

__all__ = ["Index", "Retriever"]
