"""Documents in: the test articles rendered as files of each format, ingested at the default splitting, and the QA
system's answers from them against the same from the prepared corpus.

    python benchmarks/documents_benchmark.py --retriever outputs/dpr-all-s42 --reader outputs/reader \
        --work /tmp/documents-benchmark

render: each article of --articles (SQuAD JSON; default the shared test split) as one file per format: HTML (a
<title>, an <h1>, a navigation bar and a footer to drop, an <h2> every 5 paragraphs, the paragraphs), PDF (fpdf2:
the title as metadata and heading, the same headings and paragraphs, in DejaVu Sans so that every character has a
glyph), Markdown, plain text, Word (python-docx: the title, the same headings as Heading 2, the paragraphs) and a
scanned PDF (the PDF's pages rendered at --scan_dpi by pypdfium2 and saved as images only, no text layer left, which
ingestion reads by OCR). ingest: ingest_documents.py on each format's folder, in a child (seconds with the
interpreter's start, peak RSS by GNU time, and the script's own line: pages and MB per second of its reading), once
for the articles and once for --speed_copies copies of each (the speed). qa (with --retriever and --reader): the
rest of the corpus (--corpus) with the ingested passages, indexed by qa_system.py, and qa_system.py on the
articles' questions tuned on --validation_file over the same corpus, as docs/RESULTS.md runs it on the prepared
corpus (--prepared): F1 and recall at each k of each corpus. Writes documents_cpu.json to --out.
"""

import argparse
import html
import json
import os
import shutil
import subprocess
import sys
import time

from result_file import write_result

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(ROOT, "..", "shared", "data")
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
MARK = ".documents-benchmark"  # in --work: this benchmark made it, so what it holds is its own to replace


def articles(path: str) -> list[tuple[str, list[str]]]:
    with open(path, encoding="utf-8") as f:
        return [(a["title"].replace("_", " "), [p["context"] for p in a["paragraphs"]]) for a in json.load(f)["data"]]


def sections(paragraphs: list[str]):
    """(heading, paragraphs) every 5 paragraphs: the headings a real page would have."""
    for i in range(0, len(paragraphs), 5):
        yield f"Part {i // 5 + 1}", paragraphs[i:i + 5]


FORMATS = ("txt", "md", "html", "pdf", "docx", "scanned")


def render(docs, folder: str, copies: int = 1, scan_dpi: int | None = 200) -> None:
    """Each document in every format under folder/FORMAT/, `copies` times (under names of their own); scanned at
    `scan_dpi` (None: no scanned PDFs)."""
    import docx
    import pypdfium2
    from fpdf import FPDF

    for fmt in FORMATS if scan_dpi else FORMATS[:-1]:
        os.makedirs(os.path.join(folder, fmt), exist_ok=True)
    for (title, paragraphs), copy in ((d, c) for d in docs for c in range(copies)):
        name = title.replace(" ", "_") + (f"-{copy}" if copies > 1 else "")
        body = "".join(f"<h2>{html.escape(h)}</h2>" + "".join(f"<p>{html.escape(p)}</p>" for p in ps)
                       for h, ps in sections(paragraphs))
        page = (f"<!doctype html><html><head><title>{html.escape(title)}</title><script>var x = 1;</script></head>"
                f"<body><nav><a href='/'>Home</a> <a href='/about'>About us</a> <a href='/login'>Log in</a></nav>"
                f"<main><article><h1>{html.escape(title)}</h1>{body}</article></main>"
                f"<footer>Copyright the site. All rights reserved. Privacy policy.</footer></body></html>")
        with open(os.path.join(folder, "html", name + ".html"), "w", encoding="utf-8") as f:
            f.write(page)
        with open(os.path.join(folder, "md", name + ".md"), "w", encoding="utf-8") as f:
            f.write(f"# {title}\n\n" + "".join(f"## {h}\n\n" + "".join(p + "\n\n" for p in ps)
                                               for h, ps in sections(paragraphs)))
        with open(os.path.join(folder, "txt", name + ".txt"), "w", encoding="utf-8") as f:
            f.write("\n\n".join(p for _, ps in sections(paragraphs) for p in ps) + "\n")
        pdf = FPDF()
        pdf.set_title(title)
        pdf.add_font("DejaVu", "", FONT)
        pdf.add_page()
        pdf.set_font("DejaVu", size=16)
        pdf.multi_cell(0, 9, title, new_x="LMARGIN", new_y="NEXT")
        for h, ps in sections(paragraphs):
            pdf.set_font("DejaVu", size=13)
            pdf.multi_cell(0, 8, h, new_x="LMARGIN", new_y="NEXT")
            pdf.set_font("DejaVu", size=10)
            for p in ps:
                pdf.multi_cell(0, 5, p, new_x="LMARGIN", new_y="NEXT")
                pdf.ln(3)
        pdf.output(os.path.join(folder, "pdf", name + ".pdf"))
        word = docx.Document()
        word.core_properties.title = title
        word.add_heading(title, level=1)
        for h, ps in sections(paragraphs):
            word.add_heading(h, level=2)
            for p in ps:
                word.add_paragraph(p)
        word.save(os.path.join(folder, "docx", name + ".docx"))
        if not scan_dpi:
            continue
        printed = pypdfium2.PdfDocument(os.path.join(folder, "pdf", name + ".pdf"))
        images = [page.render(scale=scan_dpi / 72, grayscale=True).to_pil() for page in printed]
        images[0].save(os.path.join(folder, "scanned", name + ".pdf"), save_all=True, append_images=images[1:],
                       resolution=scan_dpi)
        printed.close()


def timed(cmd: list[str], peak_file: str) -> dict:
    """A command in a child: its wall seconds (with the interpreter's start), peak RSS, and its last stdout line."""
    t0 = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-o", peak_file, "-f", "%M", *cmd], cwd=ROOT, capture_output=True,
                          text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return {"seconds": round(time.perf_counter() - t0, 2),
            "peak_rss_mb": round(int(open(peak_file).read().split()[-1]) / 1024, 1),
            "said": (proc.stdout.strip().splitlines() or [""])[-1]}


def pages(folder: str, fmt: str) -> int:
    if fmt not in ("pdf", "scanned"):
        return len(os.listdir(folder))
    from pypdf import PdfReader
    return sum(len(PdfReader(os.path.join(folder, n)).pages) for n in os.listdir(folder))


def ingest(folder: str, fmt: str) -> dict:
    source, out = os.path.join(folder, fmt), os.path.join(folder, f"{fmt}.jsonl")
    # a scanned PDF goes through OCR (--ocr auto: its pages have no text layer)
    run = timed([sys.executable, "ingest_documents.py", "--documents", source, "--output", out], out + ".peak")
    mb = sum(os.path.getsize(os.path.join(source, n)) for n in os.listdir(source)) / 1e6
    n_pages = pages(source, fmt)
    with open(out, encoding="utf-8") as f:
        passages = [json.loads(line) for line in f]
    words = [len(p["text"].split()) for p in passages]
    return {"files": len(os.listdir(source)), "pages": n_pages, "mb": round(mb, 3), **run,
            "passages": len(passages), "words_mean": round(sum(words) / len(words), 1), "words_max": max(words)}


def qa(args, corpus: str, out: str) -> dict:
    timed([sys.executable, "qa_system.py", "--retriever", args.retriever, "--reader", args.reader, "--passages", corpus,
           "--questions", args.articles, "--validation_file", args.validation_file, "--output_dir", out,
           "--overwrite_output_dir"], out + ".peak")
    with open(os.path.join(out, "eval_results.json")) as f:
        rows = json.load(f)["rows"]
    return {str(r["k"]): {"f1": r.get("f1"), "exact": r.get("exact"), "recall": r.get("recall")} for r in rows}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--articles", default=os.path.join(SHARED, "squad", "test.json"))
    p.add_argument("--prepared", default=os.path.join(SHARED, "dpr", "test_passages.jsonl"))
    p.add_argument("--corpus", default=os.path.join(SHARED, "dpr", "passages.jsonl"))
    p.add_argument("--validation_file", default=os.path.join(SHARED, "squad", "dev.json"))
    p.add_argument("--retriever")
    p.add_argument("--reader")
    p.add_argument("--formats", nargs="+", default=["html", "pdf"], help="the formats the QA system is run on")
    p.add_argument("--speed_copies", type=int, default=20, help="copies of each article ingested for the speed (the "
                   "scanned PDFs: once, their OCR is the speed measured)")
    p.add_argument("--scan_dpi", type=int, default=200, help="the resolution the scanned PDFs' pages are printed at")
    p.add_argument("--work", default="/tmp/documents-benchmark")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = p.parse_args()
    if os.path.exists(args.work) and os.listdir(args.work) and not os.path.exists(os.path.join(args.work, MARK)):
        raise SystemExit(f"--work {args.work} holds files this benchmark did not write: give an empty or new directory")
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    open(os.path.join(args.work, MARK), "w").close()
    render(articles(args.articles), args.work, scan_dpi=args.scan_dpi)
    speed = os.path.join(args.work, "speed")
    render(articles(args.articles), speed, args.speed_copies, scan_dpi=None)  # OCR's speed: the articles' own
    result = {"ingest": {fmt: ingest(args.work, fmt) for fmt in FORMATS},
              "speed": {fmt: ingest(speed, fmt) for fmt in FORMATS if fmt != "scanned"}}
    print(json.dumps(result, indent=1), flush=True)
    if args.retriever and args.reader:
        result["qa"] = {}
        for name in ["prepared", *args.formats]:
            corpus = os.path.join(args.work, f"corpus-{name}.jsonl")
            with open(corpus, "wb") as out:
                for part in (args.corpus, args.prepared if name == "prepared" else os.path.join(args.work,
                                                                                             f"{name}.jsonl")):
                    with open(part, "rb") as f:
                        shutil.copyfileobj(f, out)
            result["qa"][name] = qa(args, corpus, os.path.join(args.work, f"qa-{name}"))
            print(name, json.dumps(result["qa"][name]), flush=True)
    write_result(args.out, "documents_cpu.json", result)


if __name__ == "__main__":
    main()
