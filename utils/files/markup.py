"""An element tree's text as blocks: an HTML page's or Markdown's (rendered as HTML) visible text, and trafilatura's
main text (its XML), each parsed however deep it nests. A block is the text of an element that starts and ends one
(a paragraph, a heading, a list item), its inline elements run on; a table is a block per row that names each cell
by its column (utils/files/blocks.py), HTML's and trafilatura's tables alike."""

from copy import deepcopy

import lxml.html
from lxml import etree

from utils.errors import UserError
from utils.files.blocks import collapsed, table_rows

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
    """The text of an element tree, block by block (`blocks`: the tags that start and end one); a table's rows are
    blocks of their own (`table_blocks`)."""
    out, pieces = [], []

    def flush():
        if text := collapsed("".join(pieces)):
            out.append(text)
        pieces.clear()

    walk = etree.iterwalk(root, events=("start", "end"))
    for event, element in walk:
        if element.tag == "table" and event == "start":
            flush()
            out += table_blocks(element, blocks)
            walk.skip_subtree()  # its "end" still comes, for its tail
            continue
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


ROWS, CELLS, SECTIONS = {"tr", "row"}, {"td", "th", "cell"}, {"thead", "tbody", "tfoot"}  # HTML's and trafilatura's


def table_blocks(table, blocks: set) -> list[str]:
    """A table's caption, then a block per row naming each cell by its column (utils/files/blocks.py): HTML's
    <table> (a header row: one in <thead> or of <th> cells only) or trafilatura's (cells of role "head")."""
    caption, rows = [], []
    for child in table:
        if child.tag == "caption":
            caption += text_blocks(child, blocks)
        elif child.tag in SECTIONS:
            rows += [(row, child.tag == "thead") for row in child if row.tag in ROWS]
        elif child.tag in ROWS:
            rows.append((child, False))
    return caption + table_rows(table_grid(rows, blocks))


def table_grid(rows: list, blocks: set) -> list[tuple[list[str], bool]]:
    """Each row's cells by column, and whether it is a header row: a cell spanning rows is read in each row it spans,
    one spanning columns in its first (a header cell in each: it names them all)."""
    out, carried = [], {}  # column -> (the text a cell spanning rows leaves there, rows still to come)
    for row, in_head in rows:
        cells = [cell for cell in row if cell.tag in CELLS]
        header = in_head or bool(cells) and all(cell.tag == "th" or cell.get("role") == "head" for cell in cells)
        line = []
        for cell in cells:
            while len(line) in carried:
                carry(line, carried)
            text, column = " ".join(text_blocks(cell, blocks)), len(line)
            width, height = span(cell.get("colspan"), 1000), span(cell.get("rowspan"), 65534)
            line += [text] + [text if header else ""] * (width - 1)
            for c in range(column, column + width) if height > 1 else ():
                carried[c] = (line[c], height - 1)
        while carried and len(line) <= max(carried):
            carry(line, carried)
        out.append((line, header))
    return out


def carry(line: list[str], carried: dict) -> None:
    """The next column of `line`: the text a cell of a row above spanning this one leaves there ("" where none)."""
    text, left = carried.pop(len(line), ("", 1))
    if left > 1:
        carried[len(line)] = (text, left - 1)
    line.append(text)


def span(value, most: int) -> int:
    """A colspan's or rowspan's number of columns or rows (1 where it is not a number; at most what HTML allows)."""
    return min(int(value), most) if value and value.strip().isdigit() and int(value) > 0 else 1


def visible_blocks(root) -> list[str]:
    """What a browser shows of an HTML tree, block by block: without its head, scripts, styles, templates and
    comments."""
    root = deepcopy(root)
    etree.strip_elements(root, *HIDDEN, with_tail=False)
    return text_blocks(root, HTML_BLOCKS)


def html_tree(path: str, html: str, fragment: bool = False):
    """lxml's tree of a page (of a fragment: under a <div>), however deep its elements nest: lxml's default parser
    stops at a depth and drops the rest of the page without an error, huge_tree reads far deeper; a page it still
    stops in is a UserError, not a page cut short."""
    parser = lxml.html.HTMLParser(encoding="utf-8", huge_tree=True)
    data = html.encode("utf-8")
    tree = (lxml.html.fragment_fromstring(data, create_parent="div", parser=parser) if fragment else
            lxml.html.document_fromstring(data, parser=parser))
    for error in parser.error_log:
        if error.level == etree.ErrorLevels.FATAL:  # (libxml2's advice to use XML_PARSE_HUGE, taken, left out)
            raise UserError(f"{path}: the HTML parser stopped before the end ({error.message.split(', use ')[0]}): "
                            "its text would be cut")
    return tree
