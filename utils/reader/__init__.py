"""The reader: SQuAD data, windows, span decoding, SQuAD metrics, the reader task and the trained reader.

    from utils.reader import Reader      # the Python API of a trained reader (utils.reader.trained)
"""

from utils.reader.trained import Reader, ReaderSettings

__all__ = ["Reader", "ReaderSettings"]
