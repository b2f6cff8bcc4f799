"""Documents in, as text: the files ingest_documents.py reads, each through a library made for its format, as a title
and blocks of text (paragraphs, headings, list items, table rows; a PDF's with their page), whitespace collapsed
within a block. A file that cannot be read as a document is a one-line UserError naming it.

- .txt, .text: UTF-8 text; a block is a run of lines between blank lines. Title: the file name without extension.
- .md, .markdown: UTF-8 Markdown rendered by Python-Markdown (fenced code and tables included), all of it content,
  code blocks kept as text. Title: the first heading, else the file name.
- .html, .htm: the main text by trafilatura (navigation, headers, footers, scripts, ads and user comments left out).
  Where that keeps less than a tenth of the page's visible words (the page's text sits in markup trafilatura takes
  for boilerplate, as a sidebar's <nav>), trafilatura again with favor_recall, which keeps more; where that too
  keeps less than a tenth, the page's visible text (all but its head, scripts, styles and templates). Title:
  trafilatura's (the page's meta tags, its one <h1> or its <title> without a site name), else the file name.
- .pdf: the text layer by pypdf, page by page; a sentence is never carried across a page break. An encrypted PDF
  opens when its password is empty (as a viewer opens it). Title: the PDF's /Title, else the file name.
"""

import logging
import os
import re
from copy import deepcopy
from typing import NamedTuple, Optional

import lxml.html
import markdown
import trafilatura
from lxml import etree
from pypdf import PdfReader
from pypdf.errors import FileNotDecryptedError, PyPdfError
from trafilatura.utils import decode_file

from utils.errors import UserError

# The libraries log what they repair or drop in a file (a PDF's broken cross-reference, a page's discarded data) as
# warnings: a line each that says nothing about the corpus. Their errors still show.
for library in ("pypdf", "trafilatura"):
    logging.getLogger(library).setLevel(logging.ERROR)

FORMATS = "txt, md, html, pdf"


class Document(NamedTuple):
    name: str  # what it is ingested under (its passages' ids start with it)
    title: str
    blocks: list[tuple[str, Optional[int]]]  # (text, page): the page for a PDF, else None
    pages: int  # a PDF's pages; 1 for any other document


def document_files(paths: list[str]) -> list[tuple[str, str]]:
    """(name, path) of every document given, sorted by name: a folder's files (all of its tree, hidden files and
    folders left out) named by their path under it, with "/" between folders; a file given itself by its base
    name. A path that does not exist, a folder without files, two documents of one name or one file reached twice
    (a folder and a file in it) are UserErrors."""
    found, real = {}, {}
    for given in paths:
        if os.path.isdir(given):
            files = []
            for top, dirs, names in os.walk(given):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                files += [os.path.join(top, n) for n in sorted(names) if not n.startswith(".")]
            if not files:
                raise UserError(f"{given}: no files in this folder (hidden ones are left out)")
            named = [(os.path.relpath(f, given).replace(os.sep, "/"), f) for f in files]
        elif os.path.isfile(given):
            named = [(os.path.basename(given), given)]
        else:
            raise UserError(f"{given}: no such file or folder")
        for name, path in named:
            if name in found:
                raise UserError(f"{name}: given twice ({found[name]} and {path})")
            if os.path.realpath(path) in real:  # one file under two names: its passages would be in twice
                raise UserError(f"{path}: given twice (also as {real[os.path.realpath(path)]})")
            found[name], real[os.path.realpath(path)] = path, name
    return sorted(found.items())


def read_document(path: str, name: str) -> Document:
    """The document at `path`, ingested under `name`: its title, blocks and pages, by the reader of its extension."""
    extension = os.path.splitext(path)[1].lower()
    if extension not in READERS:
        raise UserError(f"{path}: unsupported type {extension or '(no extension)'} ({FORMATS} are read)")
    stem = os.path.splitext(os.path.basename(name))[0]
    try:
        title, blocks, pages = READERS[extension](path)
    except OSError as err:
        raise UserError(f"{path}: cannot read it ({err.strerror or err})") from None
    if not blocks:
        raise UserError(f"{path}: no text")
    return Document(name, " ".join((title or "").split()) or stem, blocks, pages)


def read_bytes(path: str) -> bytes:
    """A text format's bytes; a NUL byte means a binary file (text never holds one)."""
    with open(path, "rb") as f:
        raw = f.read()
    if b"\0" in raw:
        raise UserError(f"{path}: a binary file, not text")
    return raw


def read_text(path: str) -> str:
    """A UTF-8 text file (a byte-order mark allowed); anything else is a binary file."""
    try:
        return read_bytes(path).decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: a binary file, not text (not UTF-8: {err.reason} at byte {err.start})") from None


def collapsed(text: str) -> str:
    return " ".join(text.split())


def paragraphs(text: str, page: Optional[int] = None) -> list[tuple[str, Optional[int]]]:
    """The runs of lines between blank lines, as blocks (those with any text)."""
    return [(collapsed(part), page) for part in re.split(r"\n\s*\n", text) if part.strip()]


# Elements that start and end a block of text; the others run on inline. One set for HTML, one for trafilatura's
# XML (its <code> is inline inside a paragraph and between blocks on its own, so a code block is a block either way).
HTML_BLOCKS = {"address", "article", "aside", "blockquote", "body", "caption", "dd", "details", "dialog", "div", "dl",
               "dt", "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6",
               "header", "hr", "html", "legend", "li", "main", "nav", "ol", "p", "pre", "section", "summary",
               "table", "tbody", "thead", "tfoot", "tr", "ul"}
XML_BLOCKS = {"body", "head", "item", "list", "p", "quote", "row", "table"}
SPACED = {"br", "cell", "lb", "td", "th"}  # inline, but never run into the text beside them
HIDDEN = ("head", "script", "style", "noscript", "template", etree.Comment, etree.ProcessingInstruction)


def text_blocks(root, blocks: set) -> list[str]:
    """The text of an element tree, block by block (`blocks`: the tags that start and end one)."""
    out, pieces = [], []

    def flush():
        if text := collapsed("".join(pieces)):
            out.append(text)
        pieces.clear()

    for event, element in etree.iterwalk(root, events=("start", "end")):
        if element.tag in blocks:
            flush()
        elif element.tag in SPACED:
            pieces.append(" ")
        if event == "start":
            pieces.append(element.text or "")
        elif element is not root:  # the root's tail is not its text
            pieces.append(element.tail or "")
    flush()
    return out


def visible_blocks(root) -> list[str]:
    """What a browser shows of an HTML tree, block by block: without its head, scripts, styles, templates and
    comments."""
    root = deepcopy(root)
    etree.strip_elements(root, *HIDDEN, with_tail=False)
    return text_blocks(root, HTML_BLOCKS)


def read_txt(path: str):
    return None, paragraphs(read_text(path)), 1


def read_markdown(path: str):
    html = markdown.markdown(read_text(path), extensions=["fenced_code", "tables"])
    root = lxml.html.fragment_fromstring(html, create_parent="div")
    heading = root.xpath("(//h1|//h2|//h3|//h4|//h5|//h6)[1]")
    return heading[0].text_content() if heading else None, [(b, None) for b in visible_blocks(root)], 1


# Trafilatura's extraction is taken where it keeps at least this share of the page's visible words: less, and it has
# taken the page's text for boilerplate (a page's menus and links are seldom most of what it shows).
MAIN_TEXT_SHARE = 0.1


def read_html(path: str):
    # decoded as trafilatura decodes (UTF-8, else the detected charset), parsed once, each extraction on a copy
    html = decode_file(read_bytes(path))
    try:
        tree = lxml.html.document_fromstring(html.encode("utf-8"), parser=lxml.html.HTMLParser(encoding="utf-8"))
    except etree.ParserError:  # nothing but whitespace
        return None, [], 1
    visible = visible_blocks(tree)
    for favor_recall in (False, True):
        main = extracted(tree, favor_recall)
        if word_count(main) >= MAIN_TEXT_SHARE * word_count(visible):
            break
    else:  # trafilatura took the page's text for boilerplate
        main = visible
    # extensive=False: no extensive search for the page's date, which the corpus does not keep
    return trafilatura.extract_metadata(tree, extensive=False).title, [(b, None) for b in main], 1


def word_count(blocks: list[str]) -> int:
    return sum(len(block.split()) for block in blocks)


def extracted(tree, favor_recall: bool) -> list[str]:
    """Trafilatura's main text of a page, block by block (none where it finds none)."""
    document = trafilatura.bare_extraction(tree, favor_recall=favor_recall, include_comments=False)
    return text_blocks(document.body, XML_BLOCKS) if document is not None and document.body is not None else []


def read_pdf(path: str):
    try:
        reader = PdfReader(path)
        title = reader.metadata.title if reader.metadata else None
        texts = [page.extract_text() for page in reader.pages]
    except FileNotDecryptedError:
        raise UserError(f"{path}: an encrypted PDF (its text cannot be read without the password)") from None
    except (PyPdfError, ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
        raise UserError(f"{path}: not a readable PDF ({collapsed(str(err)) or type(err).__name__})") from None
    blocks = [block for number, text in enumerate(texts, 1) for block in paragraphs(text, number)]
    if not blocks:
        raise UserError(f"{path}: no text layer (a scanned PDF? run OCR first)")
    return title, blocks, len(texts)


READERS = {".txt": read_txt, ".text": read_txt, ".md": read_markdown, ".markdown": read_markdown,
           ".html": read_html, ".htm": read_html, ".pdf": read_pdf}
