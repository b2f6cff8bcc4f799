"""Word and PowerPoint files as blocks, each through the library made for its format.

- .docx (python-docx): the body's paragraphs, headings, list items and tables in document order (headers, footers
  and comments left out); a table is a block per row naming each cell by its column, the first row taken for the
  header (Word's tables seldom say which row is one: its "Header Row" look is on for every table it inserts), as
  utils/files/blocks.py says. Title: the core properties' title, else the first paragraph styled Title or Heading 1,
  else the file name.
- .pptx (python-pptx): slide by slide, the slide's title, then its shapes' text frames (a paragraph a block) and
  tables (a row a block, named by the first row where the table has its "header row" on) in the slide's order
  (shapes in groups included), then the slide's notes; each block's page is its slide's number, and a presentation's
  pages are its slides. Title: the core properties' title, else the first slide's title, else the file name.
"""

import io

import docx
import pptx
from docx.table import Table
from docx.text.paragraph import Paragraph
from pptx.enum.shapes import MSO_SHAPE_TYPE

from utils.files.blocks import collapsed, table_rows

TITLE_STYLES = ("Title", "Heading 1")


def read_docx(path: str, raw: bytes, config):
    document = docx.Document(io.BytesIO(raw))
    title, blocks = document.core_properties.title, []
    for item in document.iter_inner_content():
        if isinstance(item, Table):
            blocks += [(row, None) for row in docx_table(item)]
        elif text := collapsed(item.text):
            blocks.append((text, None))
            if not (title or "").strip() and item.style is not None and item.style.name in TITLE_STYLES:
                title = text
    return title, blocks, 1


def docx_table(table: Table) -> list[str]:
    """A Word table's blocks: the first row names the columns. A cell spanning columns is read in its first one (in
    the first row, in each: it names them all), one spanning rows in each row it spans."""
    rows = []
    for number, row in enumerate(table.rows):
        cells, previous = [""] * row.grid_cols_before, None
        for cell in row.cells:
            cells.append(cell_text(cell) if cell._tc is not previous or number == 0 else "")
            previous = cell._tc
        rows.append((cells, number == 0 and len(table.rows) > 1))
    return table_rows(rows)


def cell_text(cell) -> str:
    """A Word table cell's text: its paragraphs and the rows of the tables in it, on one line."""
    return " ".join(collapsed(item.text) if isinstance(item, Paragraph) else " ".join(docx_table(item))
                    for item in cell.iter_inner_content())


def read_pptx(path: str, raw: bytes, config):
    presentation = pptx.Presentation(io.BytesIO(raw))
    title, blocks = presentation.core_properties.title, []
    for number, slide in enumerate(presentation.slides, 1):
        heading = slide.shapes.title
        texts = [collapsed(heading.text_frame.text)] if heading is not None and heading.has_text_frame else []
        if texts and texts[0] and not (title or "").strip():
            title = texts[0]
        for shape in shapes_in_order(slide.shapes):
            if heading is not None and shape.shape_id == heading.shape_id:
                continue
            if shape.has_text_frame:
                texts += [collapsed(paragraph.text) for paragraph in shape.text_frame.paragraphs]
            elif shape.has_table:
                texts += pptx_table(shape.table)
        if slide.has_notes_slide and (notes := slide.notes_slide.notes_text_frame) is not None:
            texts += [collapsed(paragraph.text) for paragraph in notes.paragraphs]
        blocks += [(text, number) for text in texts if text]
    return title, blocks, len(presentation.slides)


def shapes_in_order(shapes):
    """A slide's shapes in its order, those in a group where the group is."""
    for shape in shapes:
        if shape.shape_type == MSO_SHAPE_TYPE.GROUP:
            yield from shapes_in_order(shape.shapes)
        else:
            yield shape


def pptx_table(table) -> list[str]:
    """A slide's table's blocks: named by its first row where the table's "header row" is on (PowerPoint's default
    for a table it inserts); a cell covered by a merged one is left out."""
    return table_rows([([collapsed(cell.text) if not cell.is_spanned else "" for cell in row.cells],
                        number == 0 and table.first_row and len(table.rows) > 1)
                       for number, row in enumerate(table.rows)])
