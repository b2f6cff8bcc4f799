"""Documents to the corpus, the one way both scripts do it (ingest_documents.py, index_corpus.py --documents): the
files given (utils.files.documents' listing), each read by its format's reader, cut into passages
(utils.splitting) and written whole as JSON lines {passage_id, title, text, document, passage, page} by the one
atomic writer; and what a folder's documents are now (`fingerprint`: each one's content hash), which an index kept
up to date compares, so that it reads the folder again only when a document was added, changed or removed."""

import hashlib
import os
import sys

from utils.errors import UserError
from utils.files.documents import DocumentsConfig, NotADocument, document_files, read_document
from utils.files.jsonfiles import write_json_lines
from utils.splitting import SplitConfig, split_passages


def corpus_rows(config: DocumentsConfig, split: SplitConfig, files: list[tuple[str, str]], counts: dict):
    """The rows of the corpus, document after document; `counts` tallies what was read and skipped."""
    for name, path in files:
        try:
            document = read_document(path, name, config.ocr)
        except UserError as err:
            if not config.skip_bad_files and not isinstance(err, NotADocument):
                raise
            counts["skipped"].append(str(err))
            continue
        counts["documents"] += 1
        counts["pages"] += document.pages
        counts["bytes"] += os.path.getsize(path)
        for n, (text, page) in enumerate(split_passages(document.blocks, split)):
            yield {"passage_id": f"{name}#{n}", "title": document.title, "text": text, "document": name,
                   "passage": n, **({"page": page} if page is not None else {})}
    for line in counts["skipped"]:
        print(f"skipped: {line}", file=sys.stderr)
    if not counts["documents"]:
        raise UserError(f"no document could be read ({len(counts['skipped'])} skipped): nothing written")


def ingest(config: DocumentsConfig, split: SplitConfig, output: str) -> dict:
    """The documents of `config` as the corpus `output`, written whole or not at all. Returns the counts:
    {"documents", "pages", "bytes", "skipped": [lines], "passages"}."""
    files, skipped = document_files(config.documents, config.skip_bad_files)
    counts = {"documents": 0, "pages": 0, "bytes": 0, "skipped": skipped}
    counts["passages"] = write_json_lines(output, corpus_rows(config, split, files, counts))
    return counts


def fingerprint(config: DocumentsConfig) -> dict[str, str]:
    """{name: a hash of its bytes} of every document the folders and files hold now: what changed between two
    fingerprints is what was added, changed or removed, whatever the files' times say."""
    files, _ = document_files(config.documents, skip_bad_files=True)
    out = {}
    for name, path in files:
        digest = hashlib.blake2b(digest_size=16)
        try:
            with open(path, "rb", opener=lambda file, flags: os.open(file, flags | os.O_NONBLOCK)) as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
        except OSError:  # gone or unreadable since it was listed: reading it again says so
            digest.update(b"\0unreadable")
        out[name] = digest.hexdigest()
    return out
