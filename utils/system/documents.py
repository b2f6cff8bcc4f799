"""Where an answer is: the link to the document a passage was read from, and the document served by serve.py from the
folders the index was built from (index_corpus.py --documents records them in its manifest; an index built from
JSON lines has none, and serves nothing).

A link names the document and the passage by its place in the index: `/documents/NAME?passage=POSITION`, and for a
PDF `#page=N`, where a browser's viewer opens it. What is served, read-only: only a document the index lists (the
passage at POSITION must be NAME's), only a regular file, and only where its real path lies inside the folder (or
is the file) the index was built from, so `..`, an encoded or absolute path, or a symlink leading outside the folder
is not found. A PDF is the file itself; any other document is shown as the text the index read from it, its
passages in order (their overlaps once), the passage linked highlighted and scrolled to."""

import html
import mimetypes
import os
from urllib.parse import quote

VIEWED_AS_THEMSELVES = (".pdf",)  # a browser shows them, at the page the link names


def link(documents: list[str] | None, source: dict | None, position: int | None) -> str | None:
    """The link to a passage's document (None without one: an index of JSON lines, or a passage without source)."""
    if not documents or not source or "document" not in source or position is None:
        return None
    name = source["document"]
    page = f"#page={source['page']}" if name.lower().endswith(VIEWED_AS_THEMSELVES) and source.get("page") else ""
    return f"/documents/{quote(name, safe='/')}?passage={int(position)}{page}"


def document_path(index, name: str, position: int) -> str | None:
    """The file of document `name` the index lists at passage `position`, None where it lists none there or the file
    is not inside the folder (or is not the file) the index was built from."""
    roots = getattr(index, "documents", None)
    if not roots or not 0 <= position < len(index.passages) or index.passages[position].get("document") != name:
        return None
    for root in roots:
        if os.path.isdir(root):
            inside, candidate = os.path.realpath(root), os.path.join(root, name)
        elif os.path.basename(root) == name:
            inside, candidate = os.path.realpath(root), root
        else:
            continue
        real = os.path.realpath(candidate)
        if (real == inside or os.path.commonpath([inside, real]) == inside) and os.path.isfile(real):
            return real
    return None


def media_type(path: str) -> str:
    return mimetypes.guess_type(path)[0] or "application/octet-stream"


def viewed_as_itself(name: str) -> bool:
    return name.lower().endswith(VIEWED_AS_THEMSELVES)


def document_view(index, name: str, position: int) -> str:
    """An HTML page of document `name` as the index read it: its passages in order, each overlap once, the one at
    `position` highlighted (id "passage") and a link to the original file."""
    first = position
    while first > 0 and index.passages[first - 1].get("document") == name:
        first -= 1
    text, spans, at = "", {}, first
    while at < len(index.passages) and index.passages[at].get("document") == name:
        passage = index.passages[at]["text"]
        overlap = shared_edge(text, passage)
        if text and not overlap:  # passages that do not overlap: a new paragraph
            text += "\n"
        spans[at] = (len(text) - overlap, len(text) - overlap + len(passage))
        text += passage[overlap:]
        at += 1
    start, end = spans[position]
    title = index.passages[position].get("title") or name
    body = (html.escape(text[:start]) + '<mark id="passage">' + html.escape(text[start:end]) + "</mark>"
            + html.escape(text[end:]))
    original = f"/documents/{quote(name, safe='/')}?passage={position}&original=1"
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            "<style>body{font:16px/1.5 system-ui,sans-serif;max-width:48rem;margin:2rem auto;padding:0 1rem}"
            "main{white-space:pre-wrap}mark{background:#ffe08a}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><p><a href=\"{original}\">{html.escape(name)}</a> (the original)</p>"
            f"<main>{body}</main><script>document.getElementById('passage').scrollIntoView()</script></body></html>")


def shared_edge(text: str, passage: str) -> int:
    """The characters `passage` repeats from the end of `text` (a passage starts with the last whole sentences of
    the one before it), 0 where none: the longest, starting where a word starts in `text` and ending where one ends
    in `passage`."""
    for size in range(min(len(text), len(passage)), 0, -1):
        if text.endswith(passage[:size]) and (size == len(text) or text[-size - 1] in " \n") and \
                (size == len(passage) or passage[size] in " \n"):
            return size
    return 0
