"""Documents in, as text: the files ingest_documents.py reads, each through a library made for its format, as a title
and blocks of text (paragraphs, headings, list items, table rows; a PDF's and a presentation's with their page or
slide), whitespace collapsed within a block (utils/files/blocks.py). A table is a block per row that names each
cell by its column ("Year: 1871; Designer: Robert Stevenson") where the table has a header row, in every format. A
file that cannot be read as a document is a one-line UserError naming it: any failure of a format's library on one
file is that file's error (`read_document`), never a traceback that ends the run. How a document is read beside its
format (OCR): DocumentsConfig, the flags of every script that reads documents.

- .txt, .text: text; a block is a run of lines between blank lines. Title: the file name without extension.
- .md, .markdown: Markdown rendered by Python-Markdown (fenced code and tables included), all of it content, code
  blocks kept as text. YAML front matter (`---` lines around it at the very start of the file) is read with
  PyYAML, not taken as text: its `title` is the title; front matter that is not a YAML mapping is left as text.
  Title: front matter's, else the first heading, else the file name. A table's header row is its first (Markdown's
  tables always have one).
- .html, .htm: the main text by trafilatura (navigation, headers, footers, scripts, ads and user comments left out).
  Where that keeps less than a tenth of the page's visible words (the page's text sits in markup trafilatura takes
  for boilerplate, as a sidebar's <nav>), trafilatura again with favor_recall, which keeps more; where that too
  keeps less than a tenth, the page's visible text (all but its head, scripts, styles and templates). Title:
  trafilatura's (the page's meta tags, its one <h1> or its <title> without a site name), else the file name. A
  table's header row is a row of <th> cells (or in <thead>); it names the rows under it up to the next one. A cell
  spanning columns is read in its first one (a header cell: in each), one spanning rows in each row it spans
  (trafilatura's main text keeps it in its first row only).
- .pdf: the text layer by pypdf, page by page, and pages without one read by OCR (utils/files/pdf.py).
- .docx, .pptx: by python-docx and python-pptx (utils/files/office.py); a slide is a presentation's page.

Text (.txt, .md, .html) is decoded by its byte-order mark (UTF-8, UTF-16, UTF-32), else as UTF-8, else in the
encoding charset-normalizer detects where it names one reading; a NUL byte without a byte-order mark, or bytes no
encoding reads as text, make a binary file, and text in an encoding that cannot be told is "not UTF-8 text". HTML and
Markdown are parsed however deep they nest (lxml's default parser stops at a depth and drops the rest without an
error); a page the parser still stops in is refused. A title that is not text (a PDF's /Title that is a number) is
not used, and every block and title is made valid UTF-8 (a lone surrogate, as a PDF's font map can give, becomes
U+FFFD).

Which files: a folder's regular files, its links to files and to folders followed, each folder read once (a link to
a folder read already, or to one that holds it, is listed, not read twice); names normalised to Unicode NFC. What is
not a regular file (a named pipe, a socket, a device) is never opened: it is not a document, and is listed as such.
"""

import codecs
import logging
import os
import re
import stat
import unicodedata
from dataclasses import dataclass
from typing import Literal, NamedTuple, Optional, get_args

import markdown
import trafilatura
import yaml
from charset_normalizer import from_bytes
from lxml import etree

from utils.errors import UserError
from utils.files.blocks import collapsed, paragraphs
from utils.files.markup import XML_BLOCKS, html_tree, text_blocks, visible_blocks
from utils.files.office import read_docx, read_pptx
from utils.files.pdf import read_pdf
from utils.runtime.flags import arg

# The libraries log what they repair or drop in a file (a PDF's broken cross-reference, a page's discarded data) as
# warnings: a line each that says nothing about the corpus. Their errors still show. What pypdf logs while a PDF's
# text is extracted is kept instead (utils/files/pdf.py's `logged`): where no text came out, it tells a damaged PDF
# from a scanned one.
for library in ("pypdf", "trafilatura"):
    logging.getLogger(library).setLevel(logging.ERROR)


class Document(NamedTuple):
    name: str  # what it is ingested under (its passages' ids start with it)
    title: str
    blocks: list[tuple[str, Optional[int]]]  # (text, page): a PDF's page or a presentation's slide, else None
    pages: int  # a PDF's pages, a presentation's slides; 1 for any other document


class NotADocument(UserError):
    """A path that is not a regular file (a named pipe, a socket, a device): never opened, always left out."""


def document_files(paths: list[str], skip_bad_files: bool = False) -> tuple[list[tuple[str, str]], list[str]]:
    """(name, path) of every document given, sorted by name, and what was left out (a line each): a folder's files
    (all of its tree, hidden files and folders left out, links followed) named by their path under it, with "/"
    between folders; a file given itself by its base name; names in Unicode NFC. A folder is read once: a link to a
    folder read already or inside one, or to a folder that holds one (a loop), is left out. An unreadable folder, or
    a name that is not UTF-8, is a UserError, left out with `skip_bad_files`. A path that does not exist, a folder
    without files, two documents of one name (once in NFC) or one file reached twice (a folder and a file in it) are
    UserErrors."""
    found, spelt, real, skipped = {}, {}, {}, []

    def bad(message: str):
        if not skip_bad_files:
            raise UserError(message)
        skipped.append(message)

    # the folders read, by their real paths: a link to a folder is followed only where it leads out of all of them
    read = [os.path.realpath(given) for given in paths if os.path.isdir(given)]
    for given in paths:
        if os.path.isdir(given):
            files, left_out = [], len(skipped)
            walk = os.walk(given, followlinks=True,
                           onerror=lambda err: bad(f"{err.filename}: cannot read this folder ({err.strerror or err})"))
            for top, dirs, names in walk:
                dirs[:] = [d for d in sorted(dirs) if not d.startswith(".") and followed(os.path.join(top, d), read,
                                                                                        skipped)]
                files += [os.path.join(top, n) for n in sorted(names) if not n.startswith(".")]
            if not files and len(skipped) == left_out:
                raise UserError(f"{given}: no files in this folder (hidden ones are left out)")
            named = [(os.path.relpath(f, given).replace(os.sep, "/"), f) for f in files]
        elif os.path.lexists(given):
            named = [(os.path.basename(given), given)]
        else:
            raise UserError(f"{given}: no such file or folder")
        for raw, path in named:
            try:
                raw.encode("utf-8")
            except UnicodeEncodeError:  # bytes the file system holds that are not UTF-8: no id can name it
                bad(f"{os.fsencode(path).decode('utf-8', 'backslashreplace')}: its name is not UTF-8 (rename it)")
                continue
            name = unicodedata.normalize("NFC", raw)  # "café" is one name however its letters are encoded
            if name in found:
                nfc = "" if spelt[name] == raw else ", names equal in Unicode NFC"
                raise UserError(f"{name}: given twice ({found[name]} and {path}{nfc})")
            if os.path.realpath(path) in real:  # one file under two names: its passages would be in twice
                raise UserError(f"{path}: given twice (also as {real[os.path.realpath(path)]})")
            found[name], spelt[name], real[os.path.realpath(path)] = path, raw, name
    return sorted(found.items()), skipped


def followed(path: str, read: list[str], skipped: list[str]) -> bool:
    """Whether the walk goes into the folder `path`: yes unless it is a link to a folder read already or inside one,
    or to a folder that holds one (then listed in `skipped`); a link followed joins the folders read."""
    if not os.path.islink(path):
        return True
    target = os.path.realpath(path)
    for folder in read:
        if os.path.commonpath([folder, target]) == folder:
            skipped.append(f"{path}: a link to {target}, a folder read already or inside one (not read twice)")
            return False
        if os.path.commonpath([folder, target]) == target:
            skipped.append(f"{path}: a link to {target}, which holds a folder read (not read twice)")
            return False
    read.append(target)
    return True


def read_document(path: str, name: str, ocr: str = "auto") -> Document:
    """The document at `path`, ingested under `name`: its title, blocks and pages, by the reader of its extension
    (`ocr`: DocumentsConfig's). Whatever goes wrong in the reading is a UserError naming the file (NotADocument where
    it is not a regular file)."""
    config = DocumentsConfig(ocr=ocr)
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        raise UserError(f"{path}: cannot read it ({err.strerror or err})") from None
    if not stat.S_ISREG(mode):
        raise NotADocument(f"{path}: not a document ({SPECIAL_FILES.get(stat.S_IFMT(mode), 'not a regular file')})")
    extension = os.path.splitext(path)[1].lower()
    if extension not in READERS:
        raise UserError(f"{path}: unsupported type {extension or '(no extension)'} ({FORMATS} are read)")
    reader, kind = READERS[extension]
    try:
        # O_NONBLOCK: a named pipe put in the file's place since the check above is read as empty, not waited on
        with open(path, "rb", opener=lambda file, flags: os.open(file, flags | os.O_NONBLOCK)) as f:
            raw = f.read()
        title, blocks, pages = reader(path, raw, config)
    except UserError:
        raise
    except OSError as err:
        raise UserError(f"{path}: cannot read it ({err.strerror or err})") from None
    except Exception as err:  # the format's library failed on this file (not Ctrl-C: that is no Exception)
        error = f"{type(err).__name__}: {collapsed(str(err))}" if collapsed(str(err)) else type(err).__name__
        raise UserError(f"{path}: not a readable {kind} ({error})") from None
    blocks = [(valid_text(text), page) for text, page in blocks]
    if not blocks:
        raise UserError(f"{path}: no text")
    stem = os.path.splitext(os.path.basename(name))[0]
    return Document(name, collapsed(valid_text(title)) if isinstance(title, str) and title.strip() else stem, blocks,
                    pages)


SPECIAL_FILES = {stat.S_IFIFO: "a named pipe", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device",
                 stat.S_IFBLK: "a device"}


def valid_text(text: str) -> str:
    """`text` as UTF-8 can hold it: surrogate pairs joined, a lone surrogate (which no UTF-8 writer takes) U+FFFD."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


# A byte-order mark names its encoding (the codec reads the mark); UTF-32's first: UTF-32 LE's starts with UTF-16 LE's.
BYTE_ORDER_MARKS = [(codecs.BOM_UTF32_LE, "utf-32", "UTF-32"), (codecs.BOM_UTF32_BE, "utf-32", "UTF-32"),
                    (codecs.BOM_UTF8, "utf-8-sig", "UTF-8"), (codecs.BOM_UTF16_LE, "utf-16", "UTF-16"),
                    (codecs.BOM_UTF16_BE, "utf-16", "UTF-16")]


def decoded(path: str, raw: bytes) -> str:
    """A text format's bytes as text: by its byte-order mark, else UTF-8, else the encoding charset-normalizer
    detects where it names one reading (no other reading it finds as plausible by both its measures, as little chaos
    and as much coherence, reads otherwise). A NUL byte (which text without a byte-order mark does not hold), or
    bytes no encoding reads as text, are a binary file; text whose encoding cannot be told is "not UTF-8 text"."""
    for mark, codec, encoding in BYTE_ORDER_MARKS:
        if raw.startswith(mark):
            try:
                return raw.decode(codec)
            except UnicodeDecodeError as err:
                raise UserError(f"{path}: not {encoding} text although it starts with its byte-order mark "
                                f"({err.reason} at byte {err.start})") from None
    if b"\0" in raw:
        raise UserError(f"{path}: a binary file, not text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        not_utf8 = f"{err.reason} at byte {err.start}"
    readings = from_bytes(raw)
    best = readings.best()
    if best is None:
        raise UserError(f"{path}: a binary file, not text (not UTF-8: {not_utf8}; no encoding reads it as text)")
    if any(r.chaos <= best.chaos and r.coherence >= best.coherence and str(r) != str(best)
           for r in readings if r is not best):
        raise UserError(f"{path}: not UTF-8 text ({not_utf8}) and its encoding cannot be told (save it as UTF-8)")
    return str(best)


def read_txt(path: str, raw: bytes, config: "DocumentsConfig"):
    return None, paragraphs(decoded(path, raw)), 1


# YAML front matter: "---" lines around it at the very start of a Markdown file (Jekyll's, Hugo's, Obsidian's)
FRONT_MATTER = re.compile(r"---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|$)", re.DOTALL)


def read_markdown(path: str, raw: bytes, config: "DocumentsConfig"):
    text, title = decoded(path, raw), None
    if front := FRONT_MATTER.match(text):
        try:
            matter = yaml.safe_load(front.group(1))
        except yaml.YAMLError:  # not YAML: Markdown that happens to start with a rule, left as text
            matter = None
        if isinstance(matter, dict):
            text, title = text[front.end():], matter.get("title")
    root = html_tree(path, markdown.markdown(text, extensions=["fenced_code", "tables"]), fragment=True)
    if not isinstance(title, str) or not title.strip():
        heading = root.xpath("(//h1|//h2|//h3|//h4|//h5|//h6)[1]")
        title = heading[0].text_content() if heading else None
    return title, [(b, None) for b in visible_blocks(root)], 1


# Trafilatura's extraction is taken where it keeps at least this share of the page's visible words: less, and it has
# taken the page's text for boilerplate (a page's menus and links are seldom most of what it shows).
MAIN_TEXT_SHARE = 0.1


def read_html(path: str, raw: bytes, config: "DocumentsConfig"):
    # parsed once, each extraction on a copy
    try:
        tree = html_tree(path, decoded(path, raw))
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


# each extension's reader, read_X(path, raw, config: "DocumentsConfig") -> (title, blocks, pages), and what the file is
# to be read as
READERS = {".txt": (read_txt, "text file"), ".text": (read_txt, "text file"), ".md": (read_markdown, "Markdown file"),
           ".markdown": (read_markdown, "Markdown file"), ".html": (read_html, "HTML page"),
           ".htm": (read_html, "HTML page"), ".pdf": (read_pdf, "PDF"), ".docx": (read_docx, "Word document"),
           ".pptx": (read_pptx, "PowerPoint presentation")}


def first_extensions() -> str:
    """The formats read, as messages name them: each reader's first extension in READERS."""
    first = {}
    for extension, (reader, _) in READERS.items():
        first.setdefault(reader, extension.lstrip("."))
    return ", ".join(first.values())


FORMATS = first_extensions()


@dataclass(frozen=True)
class DocumentsConfig:
    """Which documents, and how they are read beside what their format says: the flags of every script that reads
    documents (ingest_documents.py, index_corpus.py --documents)."""
    documents: Optional[list[str]] = arg(None, "Folders (all of their files, hidden ones left out, links followed) "
                                               f"and files of documents to read: {FORMATS}.")
    skip_bad_files: bool = arg(False, "Leave out a file or folder that cannot be read (listed) instead of stopping "
                                      "at it; two documents of one name stop the run even so.")
    ocr: Literal["auto", "always", "never"] = arg(
        "auto", "How a PDF's pages are read. auto: a page without a text layer (a scanned page) by OCR (Tesseract), "
                "a page with one by its text layer; always: every page by OCR (a PDF whose text layer is wrong); "
                "never: by the text layer only (a PDF without one is refused). Tesseract: apt-get install "
                "tesseract-ocr.")

    def __post_init__(self):  # the command line checks the choice; read_document's callers are checked here
        if self.ocr not in (modes := get_args(DocumentsConfig.__annotations__["ocr"])):
            raise UserError(f"--ocr must be one of {', '.join(modes)}, got {self.ocr!r}")
