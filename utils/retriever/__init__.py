"""The DPR retriever: data, sentence windows, the bi-encoder, its loss and task, negative mining, evaluation, and the
trained retriever's API: a Retriever encodes, indexes a corpus and searches an Index (utils.index.index).

    from utils.retriever import Index, Retriever      # utils.index.index, utils.retriever.retriever
"""

from utils.index.index import Index
from utils.retriever.retriever import Retriever

__all__ = ["Index", "Retriever"]
