"""ingest_documents.py on the inputs that stopped it, hung it or lost text quietly (issue 58, items 6, 7, 8, 10, 11),
each written by the test with the real libraries (fpdf2 and pypdf for the PDFs, os.mkfifo for a named pipe): a
format's library failing on one file is that file's one-line error, skipped with --skip_bad_files; what is written is
valid UTF-8; deep markup, links to folders and unreadable folders are read or listed, never dropped quietly; what is
not a regular file is never opened; text in other encodings is decoded or named; names are NFC; Markdown's front
matter gives the title; passages are bounded in characters too, and a sentence cut for the budget overlaps."""

import codecs
import json
import os
import random
import shutil
import sys
from types import SimpleNamespace

import pytest
from conftest import SAMPLE, assert_user_error, run_script
from pypdf import PdfWriter
from pypdf.generic import NameObject, NumberObject, StreamObject
from test_documents import ARTICLE, PDF_PAGES, by_document, ingest, rows, write_pdf

from utils.splitting import SplitConfig, split_passages

# --- PDFs a library fails on --------------------------------------------------------------------------------------

LONE_SURROGATE_CMAP = b"""/CIDInit /ProcSet findresource begin 12 dict begin begincmap /CMapName /Lone def
1 begincodespacerange <00> <FF> endcodespacerange
1 beginbfchar <54> <D800> endbfchar
endcmap CMapName currentdict /CMap defineresource pop end end"""


def stream(data: bytes, filter_name=None) -> StreamObject:
    """A stream of these bytes as they are, under `filter_name` (data that filter cannot decode, written raw)."""
    out = StreamObject()
    out.set_data(data)
    if filter_name:
        out[NameObject("/Filter")] = NameObject(filter_name)
    return out


def odd_pdf(path, case):
    """A one-page PDF (fpdf2) of PDF_PAGES[0], then edited by pypdf's writer as `case` says: where the writer has no
    public way to write what such files hold, its dictionaries themselves (the document information, the trailer's
    /Encrypt, a new indirect object)."""
    writer = PdfWriter(clone_from=str(write_pdf(path, PDF_PAGES[:1])))
    page = writer.pages[0]
    if case == "number-title":  # add_metadata writes every value as a string: the number goes in the dictionary
        writer._info.get_object()[NameObject("/Title")] = NumberObject(1984)
    elif case in ("encryption-v7", "certificate-encryption"):
        writer.encrypt("", "owner", algorithm="AES-256")
        key, value = (("/V", NumberObject(7)) if case == "encryption-v7" else
                      ("/Filter", NameObject("/Adobe.PubSec")))  # a certificate (public-key) security handler
        writer._encrypt_entry[NameObject(key)] = value
    elif case == "jbig2-stream":  # a filter pypdf decodes only with the jbig2dec program
        page.replace_contents(stream(b"\x97JB2\r\n\x1a\n" + bytes(range(1, 40)), "/JBIG2Decode"))
    elif case == "corrupt-flate":  # a page's compressed stream that does not decompress
        page.replace_contents(stream(b"x\x9c this is not deflate data", "/FlateDecode"))
    elif case == "lone-surrogate":  # the font's ToUnicode map sends "T" to U+D800, which UTF-8 cannot hold
        for font in page["/Resources"]["/Font"].values():
            font.get_object()[NameObject("/ToUnicode")] = writer._add_object(stream(LONE_SURROGATE_CMAP))
    else:
        raise KeyError(case)
    writer.write(str(path))
    return path


def odd_pdf_error(path, case):
    """What each odd PDF is refused for (None: it is read)."""
    if case == "jbig2-stream" and shutil.which("jbig2dec"):
        return f"{path}: "  # jbig2dec reads (and rejects) the made-up image in its own words
    return {"number-title": None, "lone-surrogate": None,
            "encryption-v7": f"{path}: not a readable PDF (NotImplementedError: Encryption V=7 NOT supported)",
            "certificate-encryption": f"{path}: not a readable PDF (NotImplementedError: only Standard PDF encryption "
                                      "handler is available)",
            "jbig2-stream": f"{path}: not a readable PDF (DependencyError: jbig2dec binary is not available.)",
            "corrupt-flate": f"{path}: a damaged PDF (no text could be read; pypdf: Error -3 while decompressing "
                             "data: "}[case]


ODD_PDFS = ["number-title", "encryption-v7", "certificate-encryption", "jbig2-stream", "corrupt-flate",
            "lone-surrogate"]


@pytest.mark.parametrize("case", ODD_PDFS)
def test_a_pdf_its_library_fails_on_is_that_files_one_line_error(tmp_path, capsys, case):
    path = odd_pdf(tmp_path / f"{case}.pdf", case)
    output = tmp_path / "corpus.jsonl"
    code, out, err = ingest(capsys, "--documents", path, "--output", output)
    expected = odd_pdf_error(path, case)
    if expected:
        assert_user_error(SimpleNamespace(returncode=code, stderr=err), expected)
        assert not output.exists()
        return
    assert code == 0, err
    (row,) = rows(output)
    assert row["title"] == case  # a /Title that is not text is not used: the file name is
    output.read_bytes().decode("utf-8")  # valid UTF-8, strictly
    assert row["text"] == (PDF_PAGES[0].replace("T", "\ufffd") if case == "lone-surrogate" else PDF_PAGES[0])


def test_skip_bad_files_lists_each_odd_pdf_and_ingests_the_rest(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    paths = {case: odd_pdf(docs / f"{case}.pdf", case) for case in ODD_PDFS}
    output = tmp_path / "corpus.jsonl"
    code, out, err = ingest(capsys, "--documents", docs, "--output", output, "--skip_bad_files")
    assert code == 0, err
    skipped = [line for line in err.splitlines() if line.startswith("skipped: ")]
    refused = [case for case in ODD_PDFS if odd_pdf_error(paths[case], case)]
    assert len(skipped) == len(err.splitlines()) == len(refused)  # one line each, nothing else
    for line, case in zip(skipped, sorted(refused)):
        assert line.startswith(f"skipped: {odd_pdf_error(paths[case], case)}"), line
    assert sorted(r["document"] for r in rows(output)) == ["lone-surrogate.pdf", "number-title.pdf"]


# --- deep markup, links, unreadable folders, named pipes ----------------------------------------------------------

def deep_html(depth):
    return ("<html><head><title>Deep</title></head><body><p>Before the deep part, a sentence.</p>"
            + "<div>" * depth + "<p>The deep text sits here.</p>" + "</div>" * depth
            + "<p>After the deep part, the last sentence.</p></body></html>")


def test_markup_nested_deep_is_read_whole_or_refused(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "deep.html").write_text(deep_html(300))
    # Markdown quoted 300 levels deep, and raw HTML in Markdown nested as deep
    (docs / "quotes.md").write_text("Before the quote.\n\n" + "> " * 300 + "The deep quote.\n\nAfter the quote.\n")
    (docs / "raw.md").write_text("Before the markup.\n\n" + "<div>" * 300 + "The deep markup.\n" + "</div>" * 300
                                 + "\n\nAfter the markup.\n")
    output = tmp_path / "corpus.jsonl"
    code, _, err = ingest(capsys, "--documents", docs, "--output", output)
    assert code == 0, err
    text = {name: " ".join(r["text"] for r in passages) for name, passages in by_document(rows(output)).items()}
    assert "The deep text sits here." in text["deep.html"] and "After the deep part" in text["deep.html"]
    assert "The deep quote." in text["quotes.md"] and "After the quote." in text["quotes.md"]
    assert "The deep markup." in text["raw.md"] and "After the markup." in text["raw.md"]

    (too_deep := tmp_path / "too-deep.html").write_text(deep_html(3000))  # past what even huge_tree parses
    code, _, err = ingest(capsys, "--documents", too_deep, "--output", output)
    assert_user_error(SimpleNamespace(returncode=code, stderr=err),
                      f"{too_deep}: the HTML parser stopped before the end (Excessive depth in document")


def test_links_to_folders_are_followed_once_and_loops_listed(tmp_path, capsys):
    docs, outside = tmp_path / "docs", tmp_path / "elsewhere"
    (docs / "sub").mkdir(parents=True)
    outside.mkdir()
    (docs / "a.txt").write_text("A file in the folder.")
    (docs / "sub" / "b.txt").write_text("A file in a subfolder.")
    (outside / "c.txt").write_text("A file the folder links to.")
    (docs / "more").symlink_to(outside, target_is_directory=True)  # out of the folder: read as more/...
    (docs / "alias").symlink_to(docs / "sub", target_is_directory=True)  # read already, as sub/
    (docs / "sub" / "loop").symlink_to(docs, target_is_directory=True)  # the folder itself: a loop
    (docs / "up").symlink_to(tmp_path, target_is_directory=True)  # a folder that holds it
    output = tmp_path / "corpus.jsonl"
    code, out, err = ingest(capsys, "--documents", docs, "--output", output)
    assert code == 0, err
    assert [r["document"] for r in rows(output)] == ["a.txt", "more/c.txt", "sub/b.txt"]
    assert err.splitlines() == [
        f"skipped: {docs / 'alias'}: a link to {docs / 'sub'}, a folder read already or inside one (not read twice)",
        f"skipped: {docs / 'up'}: a link to {tmp_path}, which holds a folder read (not read twice)",
        f"skipped: {docs / 'sub' / 'loop'}: a link to {docs}, a folder read already or inside one (not read twice)"]
    assert "(3 skipped)" in out


def ingestion(*args, launcher=(sys.executable,)):
    """ingest_documents.py in a process of its own, as from a shell (a run that hangs is killed, not the tests):
    (exit status, stdout, stderr)."""
    proc = run_script("ingest_documents.py", *args, launcher=list(launcher), check=False, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def unprivileged():
    """What runs a script to which a folder of mode 000 is unreadable: this interpreter, except as root, which reads
    it all the same (CAP_DAC_OVERRIDE): then setpriv runs it without that capability; None where that cannot be."""
    if os.geteuid() != 0:
        return [sys.executable]
    if shutil.which("setpriv"):
        return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable]
    return None


def test_an_unreadable_folder_or_file_is_a_bad_input(tmp_path):
    if (launcher := unprivileged()) is None:
        pytest.skip("root reads a folder of mode 000, and setpriv (to run without that right) is not installed")
    docs = tmp_path / "docs"
    (docs / "locked").mkdir(parents=True)
    (docs / "a.txt").write_text("A readable file.")
    (docs / "locked" / "b.txt").write_text("A file in a folder no one may read.")
    (docs / "secret.txt").write_text("A file no one may read.")
    output = tmp_path / "corpus.jsonl"
    for path in (docs / "locked", docs / "secret.txt"):
        path.chmod(0)
    try:
        code, _, err = ingestion("--documents", docs, "--output", output, launcher=launcher)
        assert_user_error(SimpleNamespace(returncode=code, stderr=err),
                          f"{docs / 'locked'}: cannot read this folder (Permission denied)")
        assert not output.exists()
        code, out, err = ingestion("--documents", docs, "--output", output, "--skip_bad_files", launcher=launcher)
        assert code == 0, err
        assert err.splitlines() == [f"skipped: {docs / 'locked'}: cannot read this folder (Permission denied)",
                                    f"skipped: {docs / 'secret.txt'}: cannot read it (Permission denied)"]
        assert [r["document"] for r in rows(output)] == ["a.txt"]
    finally:
        for path in (docs / "locked", docs / "secret.txt"):
            path.chmod(0o755)


@pytest.mark.parametrize("flag", [[], ["--skip_bad_files"]], ids=["without-skip", "with-skip"])
def test_a_named_pipe_is_never_opened_and_is_listed(tmp_path, flag):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("A good file.")
    os.mkfifo(docs / "pipe.txt")  # opened to be read, it waits for a writer for ever
    output = tmp_path / "corpus.jsonl"
    for documents in ([docs], [docs / "pipe.txt", docs / "a.txt"]):  # in a folder, and given itself
        code, _, err = ingestion("--documents", *documents, "--output", output, *flag)
        assert code == 0, err
        assert err.splitlines() == [f"skipped: {docs / 'pipe.txt'}: not a document (a named pipe)"]
        assert [r["document"] for r in rows(output)] == ["a.txt"]


# --- encodings, names, front matter -------------------------------------------------------------------------------

FRENCH = ("Le phare d'Alexandrie fut construit sous le règne de Ptolémée II. Il était considéré comme l'une des sept "
          "merveilles du monde. Sa hauteur est estimée à plus de cent mètres, ce qui en faisait l'une des plus hautes "
          "structures de son époque. Des tremblements de terre l'endommagèrent entre 956 et 1323.")


def test_text_is_decoded_by_its_byte_order_mark_or_its_detected_encoding(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    page = f"<html><head><title>Le phare</title></head><body><article><p>{FRENCH}</p></article></body></html>"
    (docs / "utf16.txt").write_bytes("\ufeff".encode("utf-16-le") + ARTICLE[0].encode("utf-16-le"))
    (docs / "utf16.html").write_bytes(page.encode("utf-16"))  # the codec writes the mark (little-endian here)
    (docs / "utf32.md").write_bytes(f"# Le phare\n\n{FRENCH}\n".encode("utf-32"))
    (docs / "bom.txt").write_bytes(b"\xef\xbb\xbf" + FRENCH.encode("utf-8"))
    (docs / "latin1.txt").write_bytes(FRENCH.encode("latin-1"))  # long enough for its encoding to be told
    (docs / "cp1252.html").write_bytes(page.replace("</p>", " \u201cC\u2019est l\u2019histoire du phare.\u201d</p>")
                                       .encode("cp1252"))
    output = tmp_path / "corpus.jsonl"
    code, _, err = ingest(capsys, "--documents", docs, "--output", output)
    assert code == 0, err
    docs_read = by_document(rows(output))
    text = {name: " ".join(r["text"] for r in passages) for name, passages in docs_read.items()}
    assert text["utf16.txt"] == ARTICLE[0]
    for name in ("utf16.html", "utf32.md", "bom.txt", "latin1.txt"):
        assert " ".join(text[name].split()).endswith(FRENCH), name
    assert " ".join(text["cp1252.html"].split()).endswith(f"{FRENCH} \u201cC\u2019est l\u2019histoire du phare.\u201d")
    assert {docs_read[name][0]["title"] for name in ("utf16.html", "cp1252.html", "utf32.md")} == {"Le phare"}

    # bytes no encoding reads as text, without a NUL byte: a binary file, not a page of replacement characters
    rng = random.Random(0)
    (noise := tmp_path / "noise.html").write_bytes(bytes(rng.randrange(1, 256) for _ in range(4096)))
    code, _, err = ingest(capsys, "--documents", noise, "--output", output)
    assert_user_error(SimpleNamespace(returncode=code, stderr=err), f"{noise}: a binary file, not text (not UTF-8: ")
    (torn := tmp_path / "torn.txt").write_bytes(codecs.BOM_UTF16_LE + b"\x00\xd8")  # a lone surrogate after the mark
    code, _, err = ingest(capsys, "--documents", torn, "--output", output)
    assert_user_error(SimpleNamespace(returncode=code, stderr=err),
                      f"{torn}: not UTF-16 text although it starts with its byte-order mark (")


def test_names_are_nfc_and_two_of_one_nfc_name_are_refused(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    composed, decomposed = "caf\u00e9.txt", "cafe\u0301.txt"
    (docs / decomposed).write_text("A file named in decomposed Unicode.")
    output = tmp_path / "corpus.jsonl"
    code, _, err = ingest(capsys, "--documents", docs, "--output", output)
    assert code == 0, err
    assert [(r["passage_id"], r["document"], r["title"]) for r in rows(output)] == [
        (f"{composed}#0", composed, "caf\u00e9")]
    (docs / composed).write_text("The same name, composed.")
    code, _, err = ingest(capsys, "--documents", docs, "--output", output, "--skip_bad_files")
    assert_user_error(SimpleNamespace(returncode=code, stderr=err),
                      f"{composed}: given twice ({docs / decomposed} and {docs / composed}, names equal in Unicode "
                      "NFC)")


def test_a_name_that_is_not_utf8_is_a_bad_input(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("A good file.")
    with open(os.path.join(os.fsencode(docs), b"caf\xe9.txt"), "w") as f:  # a Latin-1 name
        f.write("A file whose name no id can hold.")
    bad = docs / "caf\\xe9.txt"  # named with the byte that is not UTF-8 escaped
    output = tmp_path / "corpus.jsonl"
    code, _, err = ingest(capsys, "--documents", docs, "--output", output)
    assert_user_error(SimpleNamespace(returncode=code, stderr=err), f"{bad}: its name is not UTF-8 (rename it)")
    code, _, err = ingest(capsys, "--documents", docs, "--output", output, "--skip_bad_files")
    assert code == 0, err
    assert err.splitlines() == [f"skipped: {bad}: its name is not UTF-8 (rename it)"]
    assert [r["document"] for r in rows(output)] == ["a.txt"]


def test_markdown_front_matter_gives_the_title_and_is_not_text(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "front.md").write_text("---\ntitle: The Keeper's Guide\ndate: 2024-05-01\ntags: [lamp, log]\n---\n\n"
                                   "# Intro\n\nRead the log first.\n")
    (docs / "number.md").write_text("---\ntitle: 1984\n---\n# The heading\n\nA title that is a number.\n")
    (docs / "malformed.md").write_text("---\ntitle: [unclosed\n---\n\nThe text after it.\n")  # not YAML: text
    output = tmp_path / "corpus.jsonl"
    code, _, err = ingest(capsys, "--documents", docs, "--output", output)
    assert code == 0, err
    docs_read = by_document(rows(output))
    assert [(r["title"], r["text"]) for r in docs_read["front.md"]] == [("The Keeper's Guide",
                                                                         "Intro\nRead the log first.")]
    assert docs_read["number.md"][0]["title"] == "The heading"  # a title that is not a string is not used
    assert "title: [unclosed" in docs_read["malformed.md"][0]["text"]
    assert "The text after it." in docs_read["malformed.md"][0]["text"]


# --- the splitting: characters, and sentences cut for the budget --------------------------------------------------

def passages_of(text, **config):
    return [t for t, _ in split_passages([(text, None)], SplitConfig(**config))]


def test_text_without_sentence_punctuation_overlaps_at_its_cuts():
    words = [f"word{i}" for i in range(250)]
    passages = [p.split() for p in passages_of(" ".join(words))]  # the defaults: 100 words, 20 of overlap
    assert [(p[0], p[-1]) for p in passages] == [("word0", "word99"), ("word80", "word179"), ("word160", "word249")]
    for start in range(len(words) - 20):  # any span of up to 21 words is whole in one passage
        span = " ".join(words[start:start + 21])
        assert any(span in " ".join(p) for p in passages), start


def test_passages_are_bounded_in_characters_too(tmp_path, capsys):
    chinese = "灯塔建于托勒密二世统治时期它是古代世界七大奇迹之一" * 2000  # 50,000 characters, no space, no "."
    passages = passages_of(chinese)
    assert len(passages) > 1 and all(len(p) <= 1000 for p in passages)
    # each piece starts with the last characters of the one before: the same share of 1000 as 20 words is of 100
    assert passages[0] + "".join(p[200:] for p in passages[1:]) == chinese
    assert all(before.endswith(after[:200]) for before, after in zip(passages, passages[1:]))

    # preferably at a space: words longer than usual are never cut where a space is in reach
    long_words = " ".join(f"{i:03d}" + "x" * 46 for i in range(60))  # 60 words of 49 characters
    passages = passages_of(long_words)
    assert all(len(p) <= 1000 for p in passages)
    assert all(word.startswith(tuple("0123456789")) and len(word) == 49 for p in passages for word in p.split())

    # a 3 MB line without a space (a line of data), ingested: passages within the bound, none lost
    (line := tmp_path / "line.txt").write_text("ab" * 1_500_000)
    output = tmp_path / "corpus.jsonl"
    code, _, err = ingest(capsys, "--documents", line, "--output", output, "--overlap_words", 0)
    assert code == 0, err
    texts = [r["text"] for r in rows(output)]
    assert all(len(t) <= 1000 for t in texts) and "".join(texts) == "ab" * 1_500_000

    code, _, err = ingest(capsys, "--documents", line, "--output", output, "--max_chars", 0)
    assert_user_error(SimpleNamespace(returncode=code, stderr=err), "--max_chars must be at least 1 (got 0)")


def test_the_character_budget_changes_no_passage_of_prose():
    """The shipped sample's paragraphs (Wikipedia prose), split at the defaults, as without a character budget."""
    texts = [json.loads(line)["text"] for line in open(os.path.join(SAMPLE, "dpr_passages.jsonl"), encoding="utf-8")]
    for name in ("train.json", "dev.json"):
        with open(os.path.join(SAMPLE, name), encoding="utf-8") as f:
            texts += [p["context"] for article in json.load(f)["data"] for p in article["paragraphs"]]
    assert len(texts) > 50
    for text in texts:
        blocks = [(text, None)]
        assert list(split_passages(blocks, SplitConfig())) == list(split_passages(blocks,
                                                                                   SplitConfig(max_chars=10 ** 9)))


def test_a_sentence_cut_for_the_budget_comes_in_order_between_whole_sentences():
    short = [f"Short sentence number {i} ends here." for i in range(3)]
    long_sentence = " ".join(f"W{i}" for i in range(150)) + "."  # no sentence end in it
    passages = passages_of(" ".join(short + [long_sentence] + short))
    words = long_sentence.split()
    assert passages == [" ".join(short), " ".join(words[:100]), " ".join(words[80:] + short)]


# --- every bad input at once ---------------------------------------------------------------------------------------

def test_a_folder_of_every_bad_input_is_ingested_with_skip_bad_files_and_stops_without(tmp_path):
    docs = tmp_path / "docs"
    (docs / "locked").mkdir(parents=True)
    (docs / "good.txt").write_text(" ".join(ARTICLE))
    (docs / "locked" / "hidden-by-mode.txt").write_text("Unreadable.")
    for case in ODD_PDFS:
        odd_pdf(docs / f"{case}.pdf", case)
    os.mkfifo(docs / "pipe.txt")
    (docs / "deep.html").write_text(deep_html(3000))
    (docs / "noise.html").write_bytes(random.Random(0).randbytes(4096).replace(b"\0", b""))
    (docs / "old.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    with open(os.path.join(os.fsencode(docs), b"caf\xe9.txt"), "w") as f:
        f.write("A Latin-1 name.")
    (docs / "loop").symlink_to(docs, target_is_directory=True)
    launcher = unprivileged()
    if launcher is None:  # root, and no setpriv: the folder of mode 000 would be read, so it is left readable
        launcher = [sys.executable]
        os.remove(docs / "locked" / "hidden-by-mode.txt")
        os.rmdir(docs / "locked")
    else:
        (docs / "locked").chmod(0)
    output = tmp_path / "corpus.jsonl"
    try:
        code, _, err = ingestion("--documents", docs, "--output", output, launcher=launcher)
        assert_user_error(SimpleNamespace(returncode=code, stderr=err), str(docs))
        assert not output.exists() and len(err.splitlines()) == 1
        code, out, err = ingestion("--documents", docs, "--output", output, "--skip_bad_files", launcher=launcher)
    finally:
        if os.path.isdir(docs / "locked"):
            (docs / "locked").chmod(0o755)
    assert code == 0, err
    skipped = err.splitlines()
    assert all(line.startswith(f"skipped: {docs}") for line in skipped) and "Traceback" not in err
    refused = {"deep.html", "noise.html", "old.txt", "pipe.txt", "loop", "caf\\xe9.txt"} | {
        f"{case}.pdf" for case in ODD_PDFS if odd_pdf_error(docs / f"{case}.pdf", case)} | (
        {"locked"} if os.path.isdir(docs / "locked") else set())
    assert sorted(line.split(": ")[1][len(str(docs)) + 1:] for line in skipped) == sorted(refused)
    corpus = rows(output)
    assert {r["document"] for r in corpus} == {"good.txt", "lone-surrogate.pdf", "number-title.pdf"}
    output.read_bytes().decode("utf-8")  # valid UTF-8
    assert f"({len(refused)} skipped)" in out

