"""A PDF's text, page by page, each page's blocks carrying its number: its text layer by pypdf, and where a page has
none (a scanned page) what Tesseract reads on it (`DocumentsConfig.ocr`, --ocr): `auto` reads each page without a
text layer so, `always` every page (a PDF whose text layer is wrong), `never` none (a PDF without any text layer is
refused). A page to read is rasterised by PDFium (pypdfium2) at OCR_DPI, in grayscale, one page at a time (a page
too large for that resolution at a lower one, MAX_PIXELS at most), and Tesseract (pytesseract, running Debian's
tesseract-ocr) reads its image; its text is cut into blocks as a text layer's is. Without the tesseract program, a
page to read is one line saying how to install it.

A sentence is never carried across a page break. An encrypted PDF opens when its password is empty (as a viewer
opens it). Title: the PDF's /Title, else the file name."""

import io
import logging
import math
from contextlib import contextmanager

import pypdfium2
import pytesseract
from pypdf import PdfReader
from pypdf.errors import FileNotDecryptedError

from utils.errors import UserError
from utils.files.blocks import collapsed, paragraphs

# What Tesseract reads ordinary print well at (its documentation's advice: at least 300 dpi).
OCR_DPI = 300
# A page's pixels at most (a poster at OCR_DPI would be several hundred million): larger pages are rasterised at a
# lower resolution, so that one page's image, and what Tesseract makes of it, stay within a machine's memory.
MAX_PIXELS = 40_000_000


def read_pdf(path: str, raw: bytes, config):
    try:
        reader = PdfReader(io.BytesIO(raw))
        title = reader.metadata.title if reader.metadata else None
        # pypdf logs a stream it cannot decode (a corrupt compressed page) and reads it as no text
        with logged("pypdf") as problems:
            texts = ["" if config.ocr == "always" else page.extract_text() for page in reader.pages]
    except FileNotDecryptedError:
        raise UserError(f"{path}: an encrypted PDF (its text cannot be read without the password)") from None
    if problems and not any(text.strip() for text in texts):
        raise UserError(f"{path}: a damaged PDF (no text could be read; pypdf: {problems[0]})")
    if config.ocr != "never":
        unread = [number for number, text in enumerate(texts, 1) if not text.strip()]
        for number, text in ocr_pages(path, raw, unread, config.ocr):
            texts[number - 1] = text
    blocks = [block for number, text in enumerate(texts, 1) for block in paragraphs(text, number)]
    if not blocks and config.ocr == "never":
        raise UserError(f"{path}: no text layer (a scanned PDF? run with --ocr auto)")
    if not blocks:
        raise UserError(f"{path}: no text (no text layer, and OCR read none)")
    return title, blocks, len(texts)


def ocr_pages(path: str, raw: bytes, numbers: list[int], ocr: str):
    """(number, text) of each of these pages (numbered from 1) as Tesseract reads it, one page at a time."""
    if not numbers:
        return
    try:
        pytesseract.get_tesseract_version()
    except pytesseract.TesseractNotFoundError:
        why = ("--ocr always reads every page" if ocr == "always" else f"page {numbers[0]} has no text layer"
               if len(numbers) == 1 else f"{len(numbers)} pages have no text layer (page {numbers[0]} the first)")
        raise UserError(f"{path}: {why}, and OCR needs Tesseract, which is not installed (apt-get install "
                        "tesseract-ocr; --ocr never reads the text layer only)") from None
    document = pypdfium2.PdfDocument(raw)
    try:
        for number in numbers:
            yield number, page_text(document[number - 1])
    finally:
        document.close()


def page_text(page) -> str:
    """What Tesseract reads on a page of a PDF, rasterised by PDFium (its bitmap freed before the next page's)."""
    width, height = page.get_size()  # in points, 72 to the inch
    dpi = min(OCR_DPI, 72 * math.sqrt(MAX_PIXELS / max(width * height, 1.0)))
    bitmap = page.render(scale=dpi / 72, grayscale=True)
    try:
        # the resolution given, not guessed: Tesseract sizes what it looks for by it
        return pytesseract.image_to_string(bitmap.to_pil(), config=f"--dpi {round(dpi)}")
    finally:
        bitmap.close()
        page.close()


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
