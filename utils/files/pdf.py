"""A PDF's text layer by pypdf, page by page, each page's blocks carrying its number. A sentence is never carried
across a page break. An encrypted PDF opens when its password is empty (as a viewer opens it). Title: the PDF's
/Title, else the file name."""

import io
import logging
from contextlib import contextmanager

from pypdf import PdfReader
from pypdf.errors import FileNotDecryptedError

from utils.errors import UserError
from utils.files.blocks import collapsed, paragraphs


def read_pdf(path: str, raw: bytes):
    try:
        reader = PdfReader(io.BytesIO(raw))
        title = reader.metadata.title if reader.metadata else None
        # pypdf logs a stream it cannot decode (a corrupt compressed page) and reads it as no text
        with logged("pypdf") as problems:
            texts = [page.extract_text() for page in reader.pages]
    except FileNotDecryptedError:
        raise UserError(f"{path}: an encrypted PDF (its text cannot be read without the password)") from None
    blocks = [block for number, text in enumerate(texts, 1) for block in paragraphs(text, number)]
    if not blocks and problems:
        raise UserError(f"{path}: a damaged PDF (no text could be read; pypdf: {problems[0]})")
    if not blocks:
        raise UserError(f"{path}: no text layer (a scanned PDF? run OCR first)")
    return title, blocks, len(texts)


@contextmanager
def logged(library: str):
    """What `library` logs (warnings and errors) while the block runs, a line each: kept, not shown."""
    logger, messages, handler = logging.getLogger(library), [], logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(collapsed(record.getMessage()))
    level, propagate = logger.level, logger.propagate
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
