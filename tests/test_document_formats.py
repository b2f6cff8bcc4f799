"""Word and PowerPoint files, tables and scanned PDFs (issue 61, items 1 and 2), on small files each test writes with
the real libraries (python-docx, python-pptx; fpdf2 for a PDF, rasterised by pypdfium2 into a PDF of images without
a text layer): each Office format's blocks in order, its title and pages; a damaged one refused in one line and
skipped; a table's rows naming their columns in Word, HTML (trafilatura's main text and the visible text) and
Markdown; OCR of the pages without a text layer (auto), of every page (always), of none (never), with Tesseract
installed, and in a run whose PATH has no tesseract, one line saying how to install it."""

import os
import shutil
from types import SimpleNamespace

import docx
import pptx
import pypdfium2
import pytest
import trafilatura
from conftest import assert_user_error, run_script
from fpdf import FPDF
from pptx.util import Inches
from test_documents import ingest, rows

from utils.errors import UserError
from utils.files.blocks import table_rows
from utils.files.documents import read_document

TESSERACT = shutil.which("tesseract")
needs_tesseract = pytest.mark.skipif(TESSERACT is None, reason="Tesseract is not installed (apt-get install "
                                                                "tesseract-ocr; scripts/setup.sh installs it)")

LIGHTS = [["Year", "Designer", "Light"], ["1810", "Robert Stevenson", "Bell Rock"],
          ["1844", "Alan Stevenson", "Skerryvore"]]
LIGHT_ROWS = ["Year: 1810; Designer: Robert Stevenson; Light: Bell Rock",
              "Year: 1844; Designer: Alan Stevenson; Light: Skerryvore"]


def blocks_of(path, name=None, **options):
    return read_document(str(path), name or os.path.basename(path), **options).blocks


# --- Word ----------------------------------------------------------------------------------------------------------

def write_docx(path, title=None, heading=True):
    document = docx.Document()
    if title:
        document.core_properties.title = title
    document.sections[0].header.paragraphs[0].text = "HEADERTEXT on every page"
    document.sections[0].footer.paragraphs[0].text = "FOOTERTEXT on every page"
    if heading:
        document.add_heading("The Northern Lights", 0)  # styled Title
    document.add_paragraph("The Stevensons built the lighthouses of Scotland.")
    document.add_heading("Who built which", 1)
    document.add_paragraph("Bell Rock stands on a reef.", style="List Bullet")
    document.add_paragraph("Skerryvore is the tallest.", style="List Number")
    table = document.add_table(rows=len(LIGHTS), cols=3)
    for r, cells in enumerate(LIGHTS):
        for c, text in enumerate(cells):
            table.cell(r, c).text = text
    document.add_paragraph("The keepers left in 1998.")
    document.save(str(path))
    return path


def test_a_word_document_gives_its_paragraphs_headings_items_and_tables_in_order(tmp_path, capsys):
    path = write_docx(tmp_path / "lights.docx")
    document = read_document(str(path), "lights.docx")
    assert document.blocks == [(text, None) for text in [
        "The Northern Lights", "The Stevensons built the lighthouses of Scotland.", "Who built which",
        "Bell Rock stands on a reef.", "Skerryvore is the tallest.", *LIGHT_ROWS, "The keepers left in 1998."]]
    assert document.title == "The Northern Lights" and document.pages == 1  # the Title paragraph; headers left out
    assert read_document(str(write_docx(tmp_path / "titled.docx", title="Lights of Scotland")),
                         "titled.docx").title == "Lights of Scotland"  # the core properties' title first
    assert read_document(str(write_docx(tmp_path / "untitled.docx", heading=False)), "untitled.docx").title == \
        "Who built which"  # no title anywhere: the first Heading 1
    plain = docx.Document()
    plain.add_paragraph("Only a paragraph.")
    plain.save(str(tmp_path / "plain.docx"))
    assert read_document(str(tmp_path / "plain.docx"), "plain.docx").title == "plain"

    output = tmp_path / "corpus.jsonl"
    code, out, err = ingest(capsys, "--documents", path, "--output", output)
    assert code == 0, err
    (row,) = rows(output)
    assert row["title"] == "The Northern Lights" and "page" not in row
    assert row["text"].split("\n")[5:7] == LIGHT_ROWS  # a row is a line of its passage


def test_a_word_tables_merged_and_nested_cells_are_read_once_by_their_column(tmp_path):
    document = docx.Document()
    table = document.add_table(rows=3, cols=3)
    for r, cells in enumerate([["Year", "Light", "Keeper"], ["1810", "Bell Rock", ""], ["1844", "", ""]]):
        for c, text in enumerate(cells):
            table.cell(r, c).text = text
    table.cell(2, 1).merge(table.cell(2, 2)).text = "Skerryvore, lit by oil"  # one cell over two columns
    table.cell(1, 2).add_table(rows=1, cols=2).rows[0].cells[0].text = "Nested keeper"
    document.save(str(tmp_path / "merged.docx"))
    assert blocks_of(tmp_path / "merged.docx") == [("Year: 1810; Light: Bell Rock; Keeper: Nested keeper", None),
                                                   ("Year: 1844; Light: Skerryvore, lit by oil", None)]


# --- PowerPoint ----------------------------------------------------------------------------------------------------

def write_pptx(path):
    presentation = pptx.Presentation()
    first = presentation.slides.add_slide(presentation.slide_layouts[1])  # title and content
    first.shapes.title.text = "Bell Rock"
    body = first.placeholders[1].text_frame
    body.text = "Built in 1810 on a reef."
    body.add_paragraph().text = "Lit by oil lamps."
    table = first.shapes.add_table(len(LIGHTS), 3, Inches(1), Inches(4), Inches(6), Inches(1)).table
    for r, cells in enumerate(LIGHTS):
        for c, text in enumerate(cells):
            table.cell(r, c).text = text
    first.notes_slide.notes_text_frame.text = "Mention the storm of 1799."
    second = presentation.slides.add_slide(presentation.slide_layouts[5])  # title only
    second.shapes.title.text = "Skerryvore"
    group = second.shapes.add_group_shape()
    group.shapes.add_textbox(Inches(1), Inches(2), Inches(4), Inches(1)).text_frame.text = "Alan Stevenson built it."
    presentation.slides.add_slide(presentation.slide_layouts[6])  # blank: a page without text
    presentation.save(str(path))
    return path


def test_a_presentation_gives_each_slide_as_a_page_title_text_tables_then_notes(tmp_path, capsys):
    path = write_pptx(tmp_path / "talk.pptx")
    document = read_document(str(path), "talk.pptx")
    assert document.blocks == [("Bell Rock", 1), ("Built in 1810 on a reef.", 1), ("Lit by oil lamps.", 1),
                               *[(row, 1) for row in LIGHT_ROWS], ("Mention the storm of 1799.", 1),
                               ("Skerryvore", 2), ("Alan Stevenson built it.", 2)]
    assert document.title == "Bell Rock" and document.pages == 3  # the first slide's title; the slides

    output = tmp_path / "corpus.jsonl"
    code, out, err = ingest(capsys, "--documents", path, "--output", output, "--max_words", 12, "--overlap_words", 0)
    assert code == 0, err
    assert "1 documents" in out
    corpus = rows(output)
    assert {r["page"] for r in corpus} == {1, 2}
    assert [r["page"] for r in corpus if "built it" in r["text"]] == [2]


@pytest.mark.parametrize("case", ["not-a-zip", "empty-zip", "the-other-format"])
def test_a_damaged_word_or_powerpoint_file_is_one_line_and_skippable(tmp_path, capsys, case):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "good.txt").write_text("A good file.")
    bad = {"lights.docx": "Word document", "talk.pptx": "PowerPoint presentation"}
    for name in bad:
        if case == "not-a-zip":
            (docs / name).write_bytes(b"PK\x03\x04 not really a zip file")
        elif case == "empty-zip":
            (docs / name).write_bytes(b"PK\x05\x06" + bytes(18))  # a zip of no files
        else:  # a presentation named .docx, a Word document named .pptx
            (write_pptx if name.endswith(".docx") else write_docx)(docs / name)
    output = tmp_path / "corpus.jsonl"
    for name, kind in bad.items():
        code, _, err = ingest(capsys, "--documents", docs / name, "--output", output)
        assert_user_error(SimpleNamespace(returncode=code, stderr=err), f"{docs / name}: not a readable {kind} (")
        assert not output.exists()
    code, out, err = ingest(capsys, "--documents", docs, "--output", output, "--skip_bad_files")
    assert code == 0, err
    assert [line.split(" (")[0] for line in err.splitlines()] == [
        f"skipped: {docs / 'lights.docx'}: not a readable Word document",
        f"skipped: {docs / 'talk.pptx'}: not a readable PowerPoint presentation"]
    assert [r["document"] for r in rows(output)] == ["good.txt"]


# --- tables in HTML and Markdown -----------------------------------------------------------------------------------

TABLE = ("<table><caption>Lights of Scotland</caption><thead><tr><th>Year</th><th>Designer</th><th>Light</th></tr>"
         "</thead><tbody>" + "".join(f"<tr><td>{y}</td><td>{d}</td><td>{n}</td></tr>" for y, d, n in LIGHTS[1:])
         + "</tbody></table>")
ARTICLE = ("<p>The Northern Lighthouse Board was set up in 1786 to build and keep the lighthouses of the coasts of "
           "Scotland, and the Stevenson family of engineers designed most of them over a century and a half.</p>")


def in_footer(table: str) -> str:
    """A page whose one table is in its footer's navigation, which trafilatura keeps nothing of, even favouring
    recall: the page is read as its visible text."""
    page = f"<html><head><title>Footer</title></head><body><footer><nav>{table}</nav></footer></body></html>"
    assert not trafilatura.extract(page) and not trafilatura.extract(page, favor_recall=True)
    return page


def test_table_rows_name_their_columns_in_html_and_markdown(tmp_path):
    # trafilatura's main text: the navigation left out, the table's rows kept as rows
    (page := tmp_path / "page.html").write_text(
        f"<html><head><title>Lights</title></head><body><nav><ul><li><a href='/'>HOMELINK</a></li></ul></nav>"
        f"<article><h1>Lights</h1>{ARTICLE}{TABLE}<p>The board still runs them today.</p></article></body></html>")
    blocks = [text for text, _ in blocks_of(page)]
    assert "HOMELINK" not in " ".join(blocks)  # the main text, not the visible text
    assert blocks[blocks.index("Lights of Scotland") + 1:][:3] == [*LIGHT_ROWS, "The board still runs them today."]

    # the page's visible text (trafilatura keeps none of a footer's navigation): the same rows
    (footer := tmp_path / "footer.html").write_text(in_footer(TABLE))
    assert [text for text, _ in blocks_of(footer)] == ["Lights of Scotland", *LIGHT_ROWS]

    # spans: a cell over two rows in each, one over two columns in its first; a later header row names what follows
    (spans := tmp_path / "spans.html").write_text(in_footer(
        "<table><tr><th>Year</th><th>Designer</th><th>Light</th></tr>"
        "<tr><td rowspan='2'>1844</td><td colspan='2'>Alan Stevenson and sons</td></tr>"
        "<tr><td>Alan</td><td>Skerryvore</td></tr><tr><th>Keeper</th><th>Years</th></tr>"
        "<tr><td>John Smith</td><td>30</td></tr></table>"))
    assert [text for text, _ in blocks_of(spans)] == ["Year: 1844; Designer: Alan Stevenson and sons",
                                                      "Year: 1844; Designer: Alan; Light: Skerryvore",
                                                      "Keeper: John Smith; Years: 30"]

    # a table without a header row: its cells joined by "; "
    (plain := tmp_path / "plain.html").write_text(in_footer("<table><tr><td>Bell Rock</td><td>1810</td></tr></table>"))
    assert blocks_of(plain) == [("Bell Rock; 1810", None)]

    (notes := tmp_path / "notes.md").write_text(
        "# Lights\n\n| Year | Designer | Light |\n|---|---|---|\n"
        + "".join(f"| {y} | {d} | {n} |\n" for y, d, n in LIGHTS[1:]) + "\nThe board still runs them.\n")
    assert blocks_of(notes) == [(text, None) for text in ["Lights", *LIGHT_ROWS, "The board still runs them."]]


def test_the_row_rule():
    assert table_rows([(["Year", "", "Light"], True), (["1810", "Robert", ""], False), (["", "", ""], False)]) == [
        "Year: 1810; Robert"]  # a column without a header: the cell alone; empty cells and rows left out
    assert table_rows([(["Year", "Light"], True)]) == ["Year; Light"]  # a header row alone is a row
    assert table_rows([(["A"], True), (["B"], True), (["1"], False)]) == ["A", "B: 1"]
    assert table_rows([(["1810", "Bell Rock"], False)]) == ["1810; Bell Rock"]


# --- scanned PDFs --------------------------------------------------------------------------------------------------

SCANNED = ["The keeper lit the lamp at dusk.\n\nStorms battered the granite tower all winter.",
           "Skerryvore was finished in 1844 by Alan Stevenson."]
TEXT_LAYER = "The first page has a text layer. Its sentences are read as they are."


def write_pdf(path, pages):
    """A PDF of these pages: ("text", text) a page with a text layer, ("scan", text) an image of the text and no text
    layer, ("both", (text, image_text)) an image of image_text under an invisible text layer of text (OCR'd PDFs and
    scanners write such layers, sometimes wrong)."""
    pdf = FPDF()
    pdf.set_font("helvetica", size=14)
    for kind, text in pages:
        pdf.add_page()
        if kind == "text":
            pdf.multi_cell(0, 8, text)
            continue
        layer, shown = text if kind == "both" else (None, text)
        pdf.image(page_image(shown), x=0, y=0, w=pdf.w, h=pdf.h)
        if layer:
            pdf.text_mode = "INVISIBLE"
            pdf.multi_cell(0, 8, layer)
            pdf.text_mode = "FILL"
    pdf.output(str(path))
    return path


def page_image(text, dpi=150):
    """An A4 page of this text as a scanner would give it: an image (of a PDF fpdf2 writes, rasterised by PDFium)."""
    pdf = FPDF()
    pdf.set_font("helvetica", size=16)
    pdf.add_page()
    pdf.multi_cell(0, 10, text)
    page = pypdfium2.PdfDocument(bytes(pdf.output()))[0]
    return page.render(scale=dpi / 72, grayscale=True).to_pil()


def words(text):
    return set(text.lower().replace(".", " ").split())


@needs_tesseract
def test_a_scanned_pdf_is_read_by_ocr_page_by_page(tmp_path, capsys):
    path = write_pdf(tmp_path / "scan.pdf", [("scan", text) for text in SCANNED])
    document = read_document(str(path), "scan.pdf")  # --ocr auto, the default
    assert document.pages == 2 and {page for _, page in document.blocks} == {1, 2}
    first = " ".join(text for text, page in document.blocks if page == 1)
    second = " ".join(text for text, page in document.blocks if page == 2)
    assert {"keeper", "lamp", "dusk", "storms", "granite", "tower"} <= words(first)  # a word or two OCR may miss
    assert {"skerryvore", "finished", "1844", "alan", "stevenson"} <= words(second)
    assert len(document.blocks) == 3  # OCR's paragraphs are blocks as a text layer's are

    output = tmp_path / "corpus.jsonl"
    code, out, err = ingest(capsys, "--documents", path, "--output", output, "--max_words", 12, "--overlap_words", 0)
    assert code == 0, err
    assert [r["page"] for r in rows(output) if "Skerryvore" in r["text"]] == [2]


@needs_tesseract
def test_a_mixed_pdf_keeps_its_text_layer_and_ocrs_the_scanned_page(tmp_path):
    path = write_pdf(tmp_path / "mixed.pdf", [("text", TEXT_LAYER), ("scan", SCANNED[1])])
    blocks = blocks_of(path)
    assert blocks[0] == (TEXT_LAYER, 1)  # the text layer as it is
    assert [page for _, page in blocks] == [1, 2] and {"skerryvore", "1844", "alan"} <= words(blocks[1][0])
    assert blocks_of(path, ocr="never") == [(TEXT_LAYER, 1)]  # the text layer only: the scanned page is left out


@needs_tesseract
def test_ocr_always_reads_a_page_whose_text_layer_is_wrong(tmp_path):
    wrong = "Garbled layer xqzv wrongword."
    path = write_pdf(tmp_path / "layered.pdf", [("both", (wrong, SCANNED[1]))])
    assert blocks_of(path) == [(wrong, 1)]  # auto: a page with a text layer keeps it
    (text, page), = blocks_of(path, ocr="always")
    assert page == 1 and {"skerryvore", "1844", "alan"} <= words(text) and "wrongword" not in text


@needs_tesseract
def test_a_pdf_without_text_anywhere_is_one_line_after_ocr(tmp_path, capsys):
    pdf = FPDF()
    pdf.add_page()
    pdf.rect(20, 20, 80, 40)
    pdf.output(str(path := tmp_path / "blank.pdf"))
    code, _, err = ingest(capsys, "--documents", path, "--output", tmp_path / "corpus.jsonl")
    assert_user_error(SimpleNamespace(returncode=code, stderr=err),
                      f"{path}: no text (no text layer, and OCR read none)")


def test_ocr_never_refuses_a_scanned_pdf_as_before(tmp_path, capsys):
    path = write_pdf(tmp_path / "scan.pdf", [("scan", SCANNED[1])])
    code, _, err = ingest(capsys, "--documents", path, "--output", tmp_path / "corpus.jsonl", "--ocr", "never")
    assert_user_error(SimpleNamespace(returncode=code, stderr=err),
                      f"{path}: no text layer (a scanned PDF? run with --ocr auto)")
    code, _, err = ingest(capsys, "--documents", path, "--output", tmp_path / "corpus.jsonl", "--ocr", "sometimes")
    assert code == 2 and "--ocr" in err and "sometimes" in err
    with pytest.raises(UserError, match="--ocr must be one of auto, always, never, got 'sometimes'"):
        read_document(str(path), "scan.pdf", ocr="sometimes")


def without_tesseract() -> dict:
    """The environment of a run that cannot find the tesseract program: PATH without the folders that hold it."""
    folders = os.environ.get("PATH", "").split(os.pathsep)
    path = os.pathsep.join(f for f in folders if not os.access(os.path.join(f, "tesseract"), os.X_OK))
    return {"PATH": path}


def test_without_tesseract_a_page_that_needs_ocr_is_one_line_saying_how_to_install_it(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    scan = write_pdf(docs / "scan.pdf", [("scan", SCANNED[0]), ("scan", SCANNED[1])])
    mixed = write_pdf(docs / "mixed.pdf", [("text", TEXT_LAYER), ("scan", SCANNED[1])])
    text = write_pdf(docs / "text.pdf", [("text", TEXT_LAYER)])
    output, env = tmp_path / "corpus.jsonl", without_tesseract()
    install = "and OCR needs Tesseract, which is not installed (apt-get install tesseract-ocr; --ocr never reads the " \
              "text layer only)"
    cases = [([scan], f"{scan}: 2 pages have no text layer (page 1 the first), {install}"),
             ([mixed], f"{mixed}: page 2 has no text layer, {install}"),
             ([text, "--ocr", "always"], f"{text}: --ocr always reads every page, {install}")]
    for argv, expected in cases:
        proc = run_script("ingest_documents.py", "--documents", *argv, "--output", output, env=env, check=False,
                          timeout=120)
        assert_user_error(proc, expected)
        assert not output.exists()
    proc = run_script("ingest_documents.py", "--documents", docs, "--output", output, "--skip_bad_files", env=env,
                      check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [f"skipped: {mixed}: page 2 has no text layer, {install}",
                                        f"skipped: {scan}: 2 pages have no text layer (page 1 the first), {install}"]
    assert [r["text"] for r in rows(output)] == [TEXT_LAYER]  # a text layer needs no Tesseract
    proc = run_script("ingest_documents.py", "--documents", mixed, "--output", output, "--ocr", "never", env=env,
                      check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert [r["text"] for r in rows(output)] == [TEXT_LAYER]


def test_the_run_without_tesseract_really_has_none():
    """The premise of the test above: the PATH it gives leaves no tesseract to find."""
    assert shutil.which("tesseract", path=without_tesseract()["PATH"]) is None
