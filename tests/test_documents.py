"""ingest_documents.py as users run it, in-process, on small files each test writes with the real libraries (fpdf2 and
pypdf for the PDFs): each format's text and title, boilerplate left out of HTML but a page whose text is in
navigation markup still read, the page each PDF passage starts on, every bad file refused in one line with no output
written or changed, --skip_bad_files, ids and bytes the same on every run, the corpus as the loaders read it, and
the splitting rules."""

import os
import random
from types import SimpleNamespace

import pytest
import trafilatura
from conftest import assert_user_error
from fpdf import FPDF
from pypdf import PdfWriter

from ingest_documents import main
from utils.errors import UserError
from utils.files.corpus import load_passages, stream_passages
from utils.files.documents import read_document
from utils.files.jsonfiles import write_json_file, write_json_lines
from utils.sentences import split_sentences
from utils.splitting import SplitConfig, split_passages

ARTICLE = ["The Lighthouse of Alexandria was built by the Ptolemaic Kingdom during the reign of Ptolemy II. It was "
           "designed by Sostratus of Cnidus and stood on the island of Pharos.",
           "It was one of the Seven Wonders of the Ancient World. Its height is estimated at over one hundred metres, "
           "which made it one of the tallest structures of its time.",
           "Earthquakes damaged it between 956 and 1323 and it became an abandoned ruin. Its stones were used to build "
           "the Citadel of Qaitbay in 1480."]

PAGE = f"""<!DOCTYPE html><html><head><title>The Lighthouse of Alexandria | Travel Notes</title>
<script>var tracking = "SCRIPTTEXT";</script><style>p {{ color: red }}</style></head><body>
<nav><ul><li><a href="/">Home</a></li><li><a href="/about">About us</a></li><li><a href="/shop">Shop</a></li></ul></nav>
<article><h2>A wonder of the world</h2>{"".join(f"<p>{p}</p>" for p in ARTICLE)}</article>
<footer><p>Copyright 2024 Travel Notes. All rights reserved.</p></footer>
<script>console.log("MORESCRIPT");</script></body></html>"""

KEEPER = [f"Entry {w} of the keeper's log tells how he lit the lamp on the {w} night of the winter storms." for w in
          ("one", "two", "three", "four", "five", "six")]
# the page's text in a sidebar's navigation: trafilatura keeps only the welcome line, favor_recall all of it
SIDEBAR = ("<html><head><title>The keeper's log</title></head><body><aside><nav>"
           + "".join(f"<p>{p}</p>" for p in KEEPER)
           + "</nav></aside><main><p>Welcome to the log.</p></main></body></html>")
# a list in a footer's navigation: trafilatura keeps nothing even with favor_recall; the visible text is the page
FOOTER = ("<html><head><title>Footnotes</title></head><body><footer><nav><ul>"
          + "".join(f"<li>{p}</li>" for p in KEEPER) + "</ul></nav></footer></body></html>")

PDF_PAGES = ["The first page tells of the lamp. It burned oil all night long.",
             "The second page tells of the storm. Waves rose over the rocks."]


def write_pdf(path, pages, title=None, rectangle_only=False):
    pdf = FPDF()
    if title:
        pdf.set_title(title)
    pdf.set_font("helvetica", size=12)
    for text in pages:
        pdf.add_page()
        if rectangle_only:
            pdf.rect(20, 20, 80, 40)
        else:
            pdf.multi_cell(0, 8, text)
    pdf.output(str(path))
    return path


def encrypted_pdf(path, source, user_password, algorithm="RC4-128"):
    writer = PdfWriter(clone_from=str(source))
    writer.encrypt(user_password, "owner", algorithm=algorithm)
    writer.write(str(path))
    return path


def ingest(capsys, *argv):
    """main(argv) in-process: (exit status, stdout, stderr)."""
    try:
        main([str(a) for a in argv])
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out, out.err


def rows(path):
    return load_passages(str(path))


@pytest.fixture
def folder(tmp_path):
    """A folder of one document of each format (and hidden files, left out)."""
    docs = tmp_path / "docs"
    (docs / "guide").mkdir(parents=True)
    (docs / ".git").mkdir()
    (docs / ".git" / "config").write_text("not a document")
    (docs / ".notes.txt").write_text("hidden")
    (docs / "plain.txt").write_text("The keeper's cottage.\n\nIt stands at the foot of the tower. The roof is red.\n")
    (docs / "guide" / "intro.md").write_text("Intro\n=====\n\nRead the *log* first.\n\n- Lamp duty at dusk.\n"
                                             "- Logbook at dawn.\n\n```\nlamp.light()\n```\n")
    (docs / "page.html").write_text(PAGE)
    (docs / "sidebar.html").write_text(SIDEBAR)
    (docs / "footer.htm").write_text(FOOTER)
    write_pdf(docs / "report.pdf", PDF_PAGES, title="The Keeper's Report")
    encrypted_pdf(docs / "open.pdf", write_pdf(tmp_path / "plain.pdf", PDF_PAGES[:1]), "", algorithm="AES-128")
    return docs


def by_document(corpus):
    out = {}
    for row in corpus:
        out.setdefault(row["document"], []).append(row)
    return out


def test_each_format_gives_its_text_and_title(folder, tmp_path, capsys):
    output = tmp_path / "corpus.jsonl"
    # passages of at most 12 words without overlap: a PDF page's text in passages of its own, read back in order
    code, out, err = ingest(capsys, "--documents", folder, "--output", output, "--max_words", 12, "--overlap_words", 0)
    assert code == 0, err
    assert out.startswith(f"{output}: 7 documents, ") and "(0 skipped)" in out and "pages/s" in out
    docs = by_document(rows(output))
    assert sorted(docs) == ["footer.htm", "guide/intro.md", "open.pdf", "page.html", "plain.txt", "report.pdf",
                            "sidebar.html"]
    text = {name: " ".join(" ".join(r["text"] for r in passages).split()) for name, passages in docs.items()}
    title = {name: {r["title"] for r in passages} for name, passages in docs.items()}

    assert title["plain.txt"] == {"plain"}
    assert text["plain.txt"] == "The keeper's cottage. It stands at the foot of the tower. The roof is red."

    assert title["guide/intro.md"] == {"Intro"}
    assert text["guide/intro.md"] == "Intro Read the log first. Lamp duty at dusk. Logbook at dawn. lamp.light()"

    assert title["page.html"] == {"The Lighthouse of Alexandria"}  # <title>, without the site's name
    for paragraph in ARTICLE:
        assert paragraph in text["page.html"]
    for boilerplate in ("Home", "About us", "Shop", "Copyright", "SCRIPTTEXT", "MORESCRIPT", "color"):
        assert boilerplate not in text["page.html"]
    # paragraphs stay blocks (a heading one of its own), a PDF's with their page
    assert read_document(str(folder / "page.html"), "page.html").blocks == [(p, None) for p in
                                                                             ["A wonder of the world", *ARTICLE]]
    assert read_document(str(folder / "report.pdf"), "report.pdf").blocks == [(PDF_PAGES[0], 1), (PDF_PAGES[1], 2)]

    # the premise: trafilatura alone keeps next to nothing of these two pages (of the second, not even with recall)
    assert trafilatura.extract(SIDEBAR) == "Welcome to the log."
    assert all(entry in trafilatura.extract(SIDEBAR, favor_recall=True) for entry in KEEPER)
    assert not trafilatura.extract(FOOTER) and not trafilatura.extract(FOOTER, favor_recall=True)
    for name in ("sidebar.html", "footer.htm"):  # the text in navigation markup is read all the same
        assert all(entry in text[name] for entry in KEEPER), name
    assert title["footer.htm"] == {"Footnotes"}

    report = docs["report.pdf"]
    assert title["report.pdf"] == {"The Keeper's Report"}
    assert text["report.pdf"] == " ".join(PDF_PAGES)
    assert {r["page"] for r in report} == {1, 2}
    for r in report:
        assert r["page"] == (1 if r["text"] in PDF_PAGES[0] else 2)
    assert text["open.pdf"] == PDF_PAGES[0] and title["open.pdf"] == {"open"}  # AES, no user password
    assert all("page" not in r for name in docs if not name.endswith(".pdf") for r in docs[name])


def test_ids_are_stable_and_the_corpus_loads_and_streams(folder, tmp_path, capsys):
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    for output in (first, second):
        code, _, err = ingest(capsys, "--documents", folder, "--output", output, "--max_words", 12,
                              "--overlap_words", 5)
        assert code == 0, err
    assert first.read_bytes() == second.read_bytes()
    corpus = rows(first)
    names = [r["document"] for r in corpus]
    assert names == sorted(names)
    for name, passages in by_document(corpus).items():
        assert [r["passage_id"] for r in passages] == [f"{name}#{n}" for n in range(len(passages))]
        assert [r["passage"] for r in passages] == list(range(len(passages)))
    streamed = [p for p, _, _ in stream_passages(str(first), 0, os.path.getsize(first))]
    assert streamed == corpus
    assert {"document", "passage", "page"} <= set(next(p for p in streamed if p["document"] == "report.pdf"))
    assert {"title", "text", "passage_id", "document", "passage"} == set(corpus[0])


def bad_file(tmp_path, case):
    """(the --documents values, the error's text) of each bad input."""
    if case == "scanned-pdf":
        path = write_pdf(tmp_path / "scan.pdf", ["", ""], rectangle_only=True)
        return [path], f"{path}: no text layer (a scanned PDF? run with --ocr auto)"  # under --ocr never
    if case == "encrypted-pdf":
        path = encrypted_pdf(tmp_path / "secret.pdf", write_pdf(tmp_path / "clear.pdf", PDF_PAGES), "secret")
        return [path], f"{path}: an encrypted PDF (its text cannot be read without the password)"
    if case == "corrupt-pdf":
        (path := tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4\nnot really a PDF\n")
        return [path], f"{path}: not a readable PDF ("
    if case == "binary-txt":
        (path := tmp_path / "image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
        return [path], f"{path}: a binary file, not text"
    if case == "latin1-txt":  # too short for its encoding to be told (Latin-1? Cyrillic? Greek?)
        (path := tmp_path / "old.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
        return [path], f"{path}: not UTF-8 text (invalid continuation byte at byte 3) and its encoding cannot be told"
    if case == "empty-txt":
        (path := tmp_path / "empty.txt").write_text(" \n\n \n")
        return [path], f"{path}: no text"
    if case == "empty-html":
        (path := tmp_path / "blank.html").write_text("<html><head><title>Blank</title></head><body></body></html>")
        return [path], f"{path}: no text"
    if case == "unsupported":
        (path := tmp_path / "letter.odt").write_bytes(b"PK\x03\x04")
        return [path], f"{path}: unsupported type .odt (txt, md, html, pdf, docx, pptx are read)"
    if case == "given-twice":
        for sub in ("one", "two"):
            (tmp_path / sub).mkdir()
            (tmp_path / sub / "a.txt").write_text(f"The {sub} file.")
        return [tmp_path / "one" / "a.txt", tmp_path / "two" / "a.txt"], \
            f"a.txt: given twice ({tmp_path / 'one' / 'a.txt'} and {tmp_path / 'two' / 'a.txt'})"
    if case == "one-file-twice":  # a folder and a file in it: one document under two names
        (docs := tmp_path / "docs").mkdir()
        (docs / "sub").mkdir()
        (docs / "sub" / "a.txt").write_text("The one file.")
        return [docs, docs / "sub" / "a.txt"], f"{docs / 'sub' / 'a.txt'}: given twice (also as sub/a.txt)"
    if case == "bad-file-in-a-folder":  # good files before it: the first bad one stops the run all the same
        (docs := tmp_path / "docs").mkdir()
        (docs / "a.txt").write_text("A good file.")
        (docs / "b.txt").write_bytes(b"\x00\x01")
        (docs / "c.txt").write_text("Another good file.")
        return [docs], f"{docs / 'b.txt'}: a binary file, not text"
    raise KeyError(case)


BAD = ["scanned-pdf", "encrypted-pdf", "corrupt-pdf", "binary-txt", "latin1-txt", "empty-txt", "empty-html",
       "unsupported", "given-twice", "one-file-twice", "bad-file-in-a-folder"]


@pytest.mark.parametrize("case", BAD)
@pytest.mark.parametrize("earlier_output", [False, True], ids=["no-output-yet", "an-earlier-output"])
def test_a_bad_file_stops_the_run_in_one_line_and_writes_nothing(tmp_path, capsys, case, earlier_output):
    documents, expected = bad_file(tmp_path, case)
    output = tmp_path / "out" / "corpus.jsonl"
    output.parent.mkdir()
    if earlier_output:
        output.write_text('{"passage_id": "old#0", "title": "", "text": "An earlier corpus."}\n')
    ocr = ["--ocr", "never"] if case == "scanned-pdf" else []  # OCR's own refusals: tests/test_document_formats.py
    code, _, err = ingest(capsys, "--documents", *documents, "--output", output, *ocr)
    assert_user_error(SimpleNamespace(returncode=code, stderr=err), expected)
    assert sorted(os.listdir(output.parent)) == (["corpus.jsonl"] if earlier_output else [])
    if earlier_output:
        assert rows(output)[0]["text"] == "An earlier corpus."


@pytest.mark.parametrize("flag", [["--skip_bad_files"], ["--skip_bad_files", "true"]], ids=["alone", "true"])
def test_skip_bad_files_goes_on_and_lists_what_it_skipped(tmp_path, capsys, flag):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("A good file. It has two sentences.")
    (docs / "b.txt").write_bytes(b"\x00\x01")
    (docs / "c.odt").write_bytes(b"PK")
    write_pdf(docs / "d.pdf", [""], rectangle_only=True)
    (docs / "e.md").write_text("# Last\n\nA good Markdown file.")
    output = tmp_path / "corpus.jsonl"
    code, out, err = ingest(capsys, "--documents", docs, "--output", output, "--ocr", "never", *flag)
    assert code == 0, err
    assert err.splitlines() == [f"skipped: {docs / 'b.txt'}: a binary file, not text",
                                f"skipped: {docs / 'c.odt'}: unsupported type .odt (txt, md, html, pdf, docx, pptx are "
                                "read)",
                                f"skipped: {docs / 'd.pdf'}: no text layer (a scanned PDF? run with --ocr auto)"]
    assert out.startswith(f"{output}: 2 documents, 2 passages (3 skipped) in ")
    assert [r["passage_id"] for r in rows(output)] == ["a.txt#0", "e.md#0"]

    for name in ("a.txt", "e.md"):  # every file bad: an error, and nothing written
        os.remove(docs / name)
    os.remove(output)
    code, _, err = ingest(capsys, "--documents", docs, "--output", output, "--ocr", "never", *flag)
    assert_user_error(SimpleNamespace(returncode=code, stderr=err), "no document could be read (3 skipped)")
    assert err.count("skipped: ") == 3 and not output.exists()
    assert not (tmp_path / "corpus.jsonl.tmp").exists()


def test_an_output_that_would_be_ingested_or_is_not_a_file_is_refused(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("A good file.")
    (tmp_path / "a_dir.jsonl").mkdir()
    cases = {str(docs / "corpus.jsonl"): "is one of the --documents or inside one of their folders",
             str(tmp_path / "a_dir.jsonl"): "is a directory, not a file",
             str(tmp_path / "corpus.json"): "give a .jsonl file",
             str(tmp_path / "nowhere" / "corpus.jsonl"): "no such directory"}
    for output, expected in cases.items():
        code, _, err = ingest(capsys, "--documents", docs, "--output", output)
        assert_user_error(SimpleNamespace(returncode=code, stderr=err), f"--output {output}: {expected}")
    (given := tmp_path / "notes.jsonl").write_text("Not a corpus: a document named .jsonl.")
    code, _, err = ingest(capsys, "--documents", given, "--output", given)
    assert_user_error(SimpleNamespace(returncode=code, stderr=err), "is one of the --documents")
    for argv, expected in [(["--max_words", 0], "--max_words must be at least 1 (got 0)"),
                           (["--overlap_words", 100], "--overlap_words must be at least 0 and less than --max_words "
                                                      "(100), got 100"),
                           (["--overlap_words", -1], "got -1"),
                           ([], None)]:
        code, _, err = ingest(capsys, "--documents", docs / "missing", "--output", tmp_path / "x.jsonl", *argv)
        assert_user_error(SimpleNamespace(returncode=code, stderr=err), expected or f"{docs / 'missing'}: no such file")
    assert sorted(os.listdir(docs)) == ["a.txt"] and not (tmp_path / "x.jsonl").exists()


# --- the splitting rules ------------------------------------------------------------------------------------

def sentence(n: int, words: int) -> str:
    return " ".join([f"S{n}"] + [f"w{n}x{i}" for i in range(words - 2)] + [f"end{n}."])


def split(blocks, max_words, overlap_words):
    return list(split_passages(blocks, SplitConfig(max_words=max_words, overlap_words=overlap_words)))


def assert_split_rules(block_lengths: list[list[int]], max_words: int, overlap_words: int):
    """The rules over blocks of sentences of the given lengths in words (none longer than max_words)."""
    blocks = [" ".join(sentence(n, k) for n, k in enumerate(lengths, 100 * b))
              for b, lengths in enumerate(block_lengths)]
    every = [s for block in blocks for s in split_sentences(block)]
    position = {s: i for i, s in enumerate(every)}
    passages = split([(block, b + 1) for b, block in enumerate(blocks)], max_words, overlap_words)
    parts = [[s for line in text.split("\n") for s in split_sentences(line)] for text, _ in passages]
    for (text, page), sentences in zip(passages, parts):
        assert len(text.split()) <= max_words
        indices = [position[s] for s in sentences]  # whole sentences of the text, consecutive
        assert indices == list(range(indices[0], indices[0] + len(indices)))
        assert page == next(b + 1 for b, block in enumerate(blocks) if sentences[0] in split_sentences(block))
    assert position[parts[0][0]] == 0 and position[parts[-1][-1]] == len(every) - 1  # all of it
    for before, after in zip(parts, parts[1:]):
        repeated = [s for s in after if s in before]
        assert repeated == before[len(before) - len(repeated):]  # the overlap: the end of the one before
        assert sum(len(s.split()) for s in repeated) <= overlap_words
        assert position[after[0]] > position[before[0]] and len(repeated) < len(after)  # it advances
        # greedy: the sentence after a passage does not fit in it
        assert len(" ".join(before).split()) + len(every[position[before[-1]] + 1].split()) > max_words


@pytest.mark.parametrize("max_words,overlap_words", [(10, 0), (10, 4), (12, 11), (30, 9), (1000, 20)])
def test_passages_are_whole_sentences_within_the_budget_with_whole_sentence_overlap(max_words, overlap_words):
    assert_split_rules([[3, 7, 4, 9, 2, 6], [5, 8, 2, 10, 3, 4]], max_words, overlap_words)


def test_the_rules_hold_for_any_lengths_and_budget():
    rng = random.Random(0)
    for _ in range(300):
        max_words = rng.randint(2, 40)
        blocks = [[rng.randint(2, max_words) for _ in range(rng.randint(1, 8))] for _ in range(rng.randint(1, 4))]
        assert_split_rules(blocks, max_words, rng.randint(0, max_words - 1))


def test_the_overlap_is_as_many_whole_sentences_as_fit_and_blocks_stay_apart():
    a, b, c, d = sentence(0, 4), sentence(1, 3), sentence(2, 3), sentence(3, 4)
    assert split([(f"{a} {b}", None), (f"{c} {d}", None)], 10, 6) == [
        (f"{a} {b}\n{c}", None),  # 4 + 3 + 3 words; d (4) does not fit
        (f"{b}\n{c} {d}", None),  # b and c (6 words) repeated, then d
    ]
    # the overlap leaves room for the first new sentence: c alone before a 5-word d, nothing before a 9-word one
    assert split([(f"{a} {b} {c} {sentence(3, 5)}", None)], 10, 6)[1] == (f"{c} {sentence(3, 5)}", None)
    assert split([(f"{a} {b} {sentence(4, 9)}", 1)], 10, 6) == [(f"{a} {b}", 1), (sentence(4, 9), 1)]


def test_a_sentence_longer_than_the_budget_is_cut_into_pieces_of_the_budget():
    words = sentence(0, 25).split()
    passages = split([(" ".join(words), 7), (sentence(1, 6), 8)], 10, 0)
    assert [len(text.split()) for text, _ in passages] == [10, 10, 5, 6]
    assert " ".join(text for text, _ in passages[:3]).split() == words
    assert [page for _, page in passages] == [7, 7, 7, 8]
    # with an overlap, the pieces overlap by as much: each starts with the last 3 words of the one before
    passages = split([(" ".join(words), 7), (sentence(1, 6), 8)], 10, 3)
    assert [text.split() for text, _ in passages] == [words[0:10], words[7:17], words[14:24],
                                                      words[21:25] + sentence(1, 6).split()]
    assert [page for _, page in passages] == [7, 7, 7, 7]


def test_a_trailing_passage_of_overlap_alone_is_not_written():
    text = " ".join(sentence(n, 4) for n in range(3))  # 12 words, budget 8: two passages, the second ends the text
    passages = split([(text, None)], 8, 4)
    assert [t for t, _ in passages] == [" ".join(sentence(n, 4) for n in range(2)),
                                        " ".join(sentence(n, 4) for n in range(1, 3))]


@pytest.mark.parametrize("max_words,overlap_words,expected", [
    (0, 0, "--max_words must be at least 1 (got 0)"),
    (10, 10, "--overlap_words must be at least 0 and less than --max_words (10), got 10"),
    (10, -1, "--overlap_words must be at least 0 and less than --max_words (10), got -1")])
def test_the_budget_is_checked_in_one_place(max_words, overlap_words, expected):
    with pytest.raises(UserError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        SplitConfig(max_words=max_words, overlap_words=overlap_words)


def test_the_atomic_writers_leave_the_file_as_it_was_when_writing_fails(tmp_path):
    path = str(tmp_path / "out.json")
    write_json_file(path, {"score": float("inf"), "n": 1})
    assert open(path).read() == '{\n "score": null,\n "n": 1\n}'
    with pytest.raises(TypeError):
        write_json_file(path, {"not JSON": object()})

    def broken_rows():
        yield {"passage_id": "a#0", "text": "first"}
        raise RuntimeError("the input broke")

    with pytest.raises(RuntimeError):
        write_json_lines(path, broken_rows())
    assert open(path).read() == '{\n "score": null,\n "n": 1\n}' and os.listdir(tmp_path) == ["out.json"]
    assert write_json_lines(path, iter([{"text": "é"}, {"text": "b"}])) == 2
    assert open(path, encoding="utf-8").read() == '{"text": "é"}\n{"text": "b"}\n'
