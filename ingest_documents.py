"""Documents to passages: folders of text, Markdown, HTML, PDF, Word and PowerPoint files into the corpus the other
scripts read.

Runbook (from the repository root, after `pip install -r requirements.txt`):

  python ingest_documents.py --documents docs/ notes.md report.pdf --output corpus.jsonl
      Reads every file under each folder (hidden ones left out, links followed) and each file given, one document at
      a time (utils/files/documents.py: each format's reader, encodings and title), cuts each into passages
      (utils/splitting.py) and writes JSON lines {passage_id, title, text, document, passage, page} for
      index_corpus.py --passages and qa_system.py --passages. The whole file or nothing: an earlier --output stays as
      it was until the run ends.

Names and ids, the same on every run: a file under a folder given is named by its path under it ("guide/intro.md"),
a file given itself by its base name, in Unicode NFC; its passages are NAME#0, NAME#1, ... (`passage`: that number;
`page`: the PDF page or the slide the passage starts on). Documents are written in the order of their names: the
same files, the same bytes. A passage is whole sentences up to --max_words words and --max_chars characters,
starting with the previous one's last sentences of up to --overlap_words; a longer sentence is cut into pieces that
overlap as much. A table, in any format, is a block (a line of its passage) per row, naming each cell by its column
where the table has a header row ("Year: 1871; Designer: ...").

  python ingest_documents.py --documents scans/ --output corpus.jsonl --ocr auto
      --ocr auto (the default): a PDF page without a text layer (a scanned page) is read by OCR, Tesseract on the
      page rasterised at 300 dpi, one page at a time, its text carrying its page as a text layer's does; a page with
      a text layer keeps it. --ocr always reads every page so (a text layer that is wrong), --ocr never the text
      layer only. Tesseract is Debian's tesseract-ocr (scripts/setup.sh installs it; apt-get install tesseract-ocr).

Refused in one line naming the file: a type other than txt, md, html, pdf, docx, pptx; a binary file; text not in
UTF-8 whose encoding cannot be told; a file without text; a PDF page to be read by OCR where Tesseract is not
installed (the line says how to install it); a PDF without a text layer under --ocr never; a PDF damaged, locked by
a password or unreadable, a Word or PowerPoint file damaged or not one (whatever a format's library fails on); a page
nested too deep to parse whole; an unreadable folder or file; a name that is not UTF-8; two documents of one name;
an --output that is a folder, lies in a folder given or is a file given. A bad file stops the run; --skip_bad_files
leaves it out and lists it (a name given twice is refused even so: two documents would share their passages' ids).
Never read, and always listed as left out: what is not a regular file (a named pipe, a socket, a device), and a link
to a folder read already or to one holding it (a loop).
"""

import os
import time
from dataclasses import dataclass

from utils.errors import UserError, exit_on_user_error
from utils.files.documents import DocumentsConfig
from utils.files.ingest import ingest
from utils.runtime.flags import arg, parse_args
from utils.splitting import SplitConfig


@dataclass(frozen=True)
class IngestArgs:
    output: str = arg(None, "The corpus to write (.jsonl), whole or not at all.")

    def __post_init__(self):
        if self.output is not None and not self.output.endswith(".jsonl"):
            raise UserError(f"--output {self.output}: give a .jsonl file (the corpus is JSON lines)")


FLAGS = (DocumentsConfig, IngestArgs, SplitConfig)


def resolve(reading: DocumentsConfig, args: IngestArgs, split: SplitConfig):
    """The checks across the parsed configs, once: the documents and the output, which must not be one of them."""
    if not reading.documents or not args.output:
        raise UserError("give --documents (folders and files) and --output (the corpus to write, .jsonl)")
    if os.path.isdir(args.output):
        raise UserError(f"--output {args.output}: is a directory, not a file")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
        raise UserError(f"--output {args.output}: no such directory {os.path.dirname(args.output)}")
    output = os.path.realpath(args.output)
    for given in map(os.path.realpath, reading.documents):
        if given == output or os.path.isdir(given) and os.path.commonpath([given, output]) == given:
            raise UserError(f"--output {args.output}: is one of the --documents or inside one of their folders "
                            "(it would be ingested with them)")
    return reading, args, split


@exit_on_user_error
def main(argv=None):
    reading, args, split = resolve(*parse_args(FLAGS, argv))
    start = time.perf_counter()
    counts = ingest(reading, split, args.output)
    seconds = max(time.perf_counter() - start, 1e-9)
    print(f"{args.output}: {counts['documents']} documents, {counts['passages']} passages ({len(counts['skipped'])} "
          f"skipped) in {seconds:.1f} s ({counts['pages'] / seconds:.1f} pages/s, "
          f"{counts['bytes'] / 1e6 / seconds:.2f} MB/s read; a PDF counts its pages, a presentation its slides, any "
          "other document one)")


if __name__ == "__main__":
    main()
