"""What every format's reader makes of its text: blocks (a paragraph, a heading, a list item, a table's row), each
one line with its whitespace collapsed; a table row as one block that names each cell's column, so that a cell read
as an answer comes with what it is ("Year: 1871; Designer: Robert Stevenson")."""

import re
from typing import Optional


def collapsed(text: str) -> str:
    return " ".join(text.split())


def paragraphs(text: str, page: Optional[int] = None) -> list[tuple[str, Optional[int]]]:
    """The runs of lines between blank lines, as blocks (those with any text)."""
    return [(collapsed(part), page) for part in re.split(r"\n\s*\n", text) if part.strip()]


def table_rows(rows: list[tuple[list[str], bool]]) -> list[str]:
    """A table's blocks, one a row: `rows` are (each column's cell text, whether it is a header row). A row under a
    header row names each of its cells by that cell's column ("Header: cell; Header: cell"; a column without a header
    gives the cell alone), a row of a table without one joins its cells by "; "; empty cells and rows are left out. A
    header row names the rows under it (up to the next header row) and is no block of its own, unless no row with
    text follows it."""
    out, names, unused = [], [], False  # unused: a header row that no row has used yet
    for cells, is_header in rows:
        cells = [collapsed(cell) for cell in cells]
        if is_header:
            if unused:
                out.append("; ".join(filter(None, names)))
            names, unused = cells, True
        elif row := "; ".join(f"{names[i]}: {cell}" if i < len(names) and names[i] else cell
                              for i, cell in enumerate(cells) if cell):
            out.append(row)
            unused = False
    if unused:
        out.append("; ".join(filter(None, names)))
    return [block for block in out if block]
