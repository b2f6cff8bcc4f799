"""The Haystack 3.x snippet of docs/COMPATIBILITY.md, run as it stands (only its three paths changed) by the
haystack3 step of scripts/check_compat.py, and its results checked against the project's APIs."""

import functools
import json
import os
import re
import sys

from compat.common import ATOL, ROOT, SAMPLE, SCORE_TOL, SNIPPET_RETRIEVERS, agreement, max_diff, retrieval_questions
from compat.token_types import WithTokenTypes

SNIPPET_PAGE = os.path.join("docs", "COMPATIBILITY.md")  # the Haystack 3.x section's snippet
SNIPPET_MARKER = "<!-- scripts/check_compat.py haystack3 runs the next block"


def haystack3_snippet():
    """The Haystack 3.x snippet users copy: the ```python block after SNIPPET_MARKER in SNIPPET_PAGE."""
    with open(os.path.join(ROOT, SNIPPET_PAGE)) as f:
        page = f.read()
    found = re.search(re.escape(SNIPPET_MARKER) + r".*?-->\s*```python\n(.*?)\n```", page, re.S)
    if not found:
        sys.exit(f"{SNIPPET_PAGE}: no ```python block after {SNIPPET_MARKER!r}")
    return found.group(1)


def run_snippet(reader_dir, retriever_dir, corpus):
    """Runs the Haystack 3.x snippet as it stands with its three paths replaced; returns its variables (ask...)."""
    code = haystack3_snippet()
    for path, value in (("outputs/reader", reader_dir), ("outputs/dpr", retriever_dir),
                        ("data/sample/dpr_passages.jsonl", corpus)):
        if code.count(f'"{path}"') != 1:
            sys.exit(f"{SNIPPET_PAGE} snippet: expected the path \"{path}\" once")
        code = code.replace(f'"{path}"', json.dumps(value))
    sys.path.insert(0, ROOT)  # its one import from the project (it says: the project's root on the path)
    namespace = {"__name__": "haystack3_snippet"}
    exec(compile(code, f"{SNIPPET_PAGE} (Haystack 3.x snippet)", "exec"), namespace)
    return namespace


def haystack3_snippet_checks(out, reference, rankings):
    """The Haystack 3.x snippet on the reader and each MiniLM retriever, its results checked against what the steps
    above compare: its top 5 passages (by best window) against the Retriever API's where Haystack embeds what the
    project does (trained without titles), else against the ranking measured above for the snippet's setting; its
    answers against the Reader API's best span over the project's top 5 (the same passages where the rankings agree): a
    note, as the reader sees no token_type_ids, and exactly once it is fed them (the diagnostic)."""
    recorded, questions = reference["retrieval"], retrieval_questions()

    def compare(ranking, want):  # rankings: [[passage_id, score] x 5] per question
        ids = lambda r: [[pid for pid, _ in hits] for hits in r]  # noqa: E731
        return {"questions": len(questions),
                "identical top-5": sum(a == b for a, b in zip(ids(ranking), ids(want))) / len(questions),
                "identical top-1": sum(a[:1] == b[:1] for a, b in zip(ids(ranking), ids(want))) / len(questions),
                "max top-5 score difference (position-wise)": max(
                    max_diff([s for _, s in a], [s for _, s in b]) for a, b in zip(ranking, want))}

    def answers_vs_reader_api(ask, want):
        return agreement({q: {"Haystack": a, "Reader API": w} for q, w in zip(questions, want)
                          if (a := ask(q)[0].data) != w}, len(questions))

    checks = {}
    for name in SNIPPET_RETRIEVERS:
        ours, label = recorded[name], f"{name}: COMPATIBILITY.md snippet"
        print(f"{label}:", flush=True)
        snippet = run_snippet(os.path.join(out, "reader"), os.path.join(out, name),
                              os.path.join(SAMPLE, "dpr_passages.jsonl"))
        ask = functools.cache(snippet["ask"])
        ranking = [[[d.meta["passage_id"], d.score] for d in ask(q)[1]] for q in questions]
        entry = compare(ranking, ours["top5"])
        if not ours["settings"]["embed_title"]:
            checks[f"{label}: top 5 passages = the project's ranking"] = {
                **entry, "ok": entry["max top-5 score difference (position-wise)"] <= SCORE_TOL}
        else:  # the setting measured above, with the saved tokenizer's separator: the same ranking
            unit = "DocumentSplitter(split_by='function')" if ours["settings"]["window_sentences"] else "whole passages"
            measured = f"{name}: {unit}, meta_fields_to_embed=['title'], embedding_separator=' {snippet['sep']} '"
            same = compare(ranking, rankings[measured])
            ok = same["identical top-5"] == 1 and same["max top-5 score difference (position-wise)"] <= ATOL
            checks[f"{label}: top 5 passages = {measured}"] = {**same, "ok": ok}
            checks[f"note: {label} vs the project's ranking"] = {**entry, "ok": True}

        want = reference["answers"][name]
        checks[f"note: {label}: answers vs the Reader API over the project's top 5"] = {
            **answers_vs_reader_api(ask, want), "ok": True}
        if not ours["settings"]["embed_title"]:  # the same passages: fed the segments, the same answers
            reader = snippet["query"].get_component("reader")
            reader.model = WithTokenTypes(reader.model, reader.tokenizer.sep_token_id)
            entry = answers_vs_reader_api(snippet["ask"], want)
            checks[f"{label}: answers + token_type_ids (diagnostic) = the Reader API over the project's top 5"] = {
                **entry, "ok": not entry["differ"]}
    return checks
