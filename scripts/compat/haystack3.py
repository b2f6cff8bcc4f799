"""The `haystack3` step of scripts/check_compat.py: the reader and the retrievers in Haystack 3.x (haystack-ai) with
the transformers-haystack and sentence-transformers-haystack integrations; the docs' snippet is haystack3_snippet.py.
"""

import json
import os
import sys

from compat.common import (ATOL, RETRIEVERS, ROOT, SAMPLE, SCORE_TOL, agreement, dev_questions, load_reference,
                           max_diff, retrieval_questions, versions)
from compat.haystack3_snippet import haystack3_snippet_checks
from compat.token_types import WithTokenTypes, pair_token_types

# Imports inside the functions: this environment has Haystack 3.x on the pinned transformers, not all the project's
# dependencies (of the project it imports only utils.sentences, standard library only).


def haystack3_reader(out, reference):
    """TransformersExtractiveReader (transformers-haystack) on the reader directory, each dev question with its
    own paragraph as the one Document: its top answer against train_reader.py's best span."""
    from haystack import Document
    from haystack.utils import ComponentDevice
    from haystack_integrations.components.readers.transformers import TransformersExtractiveReader

    reader_dir = os.path.join(out, "reader")
    with open(os.path.join(reader_dir, "reader_settings.json")) as f:
        ours = json.load(f)
    # What carries over from reader_settings.json: the window length and stride. Not the answer-length cap (the
    # reader has none) nor the SQuAD v2 null threshold (it never reads the [CLS] null logit).
    windows = {"max_seq_length": ours["max_seq_length"], "stride": ours["doc_stride"]}
    cpu = ComponentDevice.from_str("cpu")
    questions = dev_questions()

    def top_answers(reader):
        got = {}
        for qid, question, context in questions:
            answers = reader.run(query=question, documents=[Document(content=context)])["answers"]
            got[qid] = answers[0].data if answers else None  # data None: Haystack's no-answer
        return got

    def compare(got, key):
        return {qid: {"Haystack": a, "train_reader.py": reference[key].get(qid)} for qid, a in got.items()
                if a != reference[key].get(qid)}

    results = {}
    defaults = TransformersExtractiveReader(model=reader_dir, device=cpu)
    results["defaults (no_answer=True, top_k=20)"] = top_answers(defaults)
    results["no_answer=True, top_k=1"] = top_answers(TransformersExtractiveReader(model=reader_dir, device=cpu,
                                                                                  top_k=1, **windows))
    plain = TransformersExtractiveReader(model=reader_dir, device=cpu, no_answer=False, top_k=1, **windows)
    results["no_answer=False"] = top_answers(plain)
    fixed = TransformersExtractiveReader(model=reader_dir, device=cpu, no_answer=False, top_k=1, **windows)
    fixed.warm_up()
    fixed.model = WithTokenTypes(fixed.model, fixed.tokenizer.sep_token_id)
    results["diagnostic: no_answer=False + token_type_ids"] = top_answers(fixed)

    tok = plain.tokenizer
    longer = sum(len(tok(q, c)["input_ids"]) > windows["max_seq_length"] for _, q, c in questions)
    checks = {}
    for name, got in results.items():
        # Against the best span of any length: the reader caps no answer length (train_reader.py caps at 30).
        entry = {**agreement(compare(got, "best_span_any_length"), len(questions)),
                 "agree with the 30-token best span": len(questions) - len(compare(got, "best_span")),
                 "no-answer on top": sum(a is None for a in got.values())}
        if name.startswith("diagnostic"):
            # The explanation of the differences above, checked: fed the token_type_ids, the reader answers
            # exactly as train_reader.py decodes.
            checks[f"TransformersExtractiveReader ({name}) = train_reader.py's best span of any length"] = {
                **entry, "ok": not entry["differ"]}
        else:
            checks[f"note: TransformersExtractiveReader ({name}) vs train_reader.py's best span of any length"] = {
                **entry, "ok": True}
    with open(os.path.join(out, "reader-predict", "predictions.json")) as f:
        no_answer = sum(a == "" for a in json.load(f).values())
    checks["note: reader settings"] = {"carried over": windows, "dev contexts longer than one window": longer,
                                       "train_reader.py answers '' (its null threshold)": no_answer,
                                       "not carried over": {"max_answer_length": ours["max_answer_length"],
                                                            "null_threshold": ours["null_threshold"]},
                                       "ok": True}
    return checks


def haystack3_retrieval(out, reference):
    """Each retriever's query_encoder/ and passage_encoder/ in SentenceTransformersTextEmbedder /
    SentenceTransformersDocumentEmbedder, InMemoryDocumentStore and InMemoryEmbeddingRetriever over the sample's
    corpus, against the top 5 passages the project's Retriever API ranks (recorded by the train step). Returns the
    checks and {label: the top 5 [passage_id, score] of every question} of each setting that is not a diagnostic.
    """
    from haystack import Document, Pipeline
    from haystack.components.preprocessors import DocumentSplitter
    from haystack.components.retrievers.in_memory import InMemoryEmbeddingRetriever
    from haystack.document_stores.in_memory import InMemoryDocumentStore
    from haystack.utils import ComponentDevice
    from haystack_integrations.components.embedders.sentence_transformers import (SentenceTransformersDocumentEmbedder,
                                                                                  SentenceTransformersTextEmbedder)

    sys.path.insert(0, ROOT)
    from utils.sentences import window_texts  # the project's split (standard library only)

    cpu = ComponentDevice.from_str("cpu")
    recorded = reference["retrieval"]
    questions = retrieval_questions()
    with open(os.path.join(SAMPLE, "dpr_passages.jsonl")) as f:
        passages = [json.loads(line) for line in f]
    whole = [Document(content=p["text"], meta={"title": p["title"], "passage_id": p["passage_id"]}) for p in passages]
    checks, rankings = {}, {}

    for name in RETRIEVERS:
        ours, directory = recorded[name], os.path.join(out, name)
        settings, n = recorded[name]["settings"], recorded[name]["settings"]["window_sentences"]
        similarity = "cosine" if settings["similarity"] == "cosine" else "dot_product"

        def text_embedder():
            return SentenceTransformersTextEmbedder(model=f"{directory}/query_encoder", device=cpu,
                                                    progress_bar=False, local_files_only=True)

        gaps = sorted(a[1] - b[1] for hits in ours["top5"] for a, b in zip(hits, hits[1:]))
        checks[f"note: {name}: the project's top-5 score gaps"] = {
            "median": gaps[len(gaps) // 2], "smallest": gaps[0], "below SCORE_TOL": sum(g <= SCORE_TOL for g in gaps),
            "gaps": len(gaps), "ok": True}
        embedder = text_embedder()
        embedder.warm_up()
        diff = max_diff([embedder.run(text=q)["embedding"] for q in questions], ours["question_embeddings"])
        checks[f"{name}: SentenceTransformersTextEmbedder(query_encoder) = Retriever.encode_questions"] = {
            "max_abs_diff": diff, "ok": diff <= ATOL}

        # The units documents are cut into: with sentence windows, the project's windows given as Documents
        # (passage_id in meta), Haystack's DocumentSplitter with the project's splitting as its function and with
        # its own split on periods, and the unsplit passages (what a user who does not split gets).
        if n:
            project_windows = [Document(content=w["text"], meta={"title": w["title"], "passage_id": w["passage_id"],
                                                                 "window": k}) for k, w in enumerate(ours["texts"])]
            splitter = DocumentSplitter(split_by="function", splitting_function=lambda text, n=n: window_texts(text, n))
            split = splitter.run(whole)["documents"]
            same = [(d.content, d.meta["passage_id"]) for d in split] == [(w["text"], w["passage_id"])
                                                                          for w in ours["texts"]]
            checks[f"{name}: DocumentSplitter(split_by='function', the project's split) = the project's windows"] = {
                "windows": len(split), "project windows": len(ours["texts"]), "ok": same}
            units = {"project windows": project_windows,
                     "DocumentSplitter(split_by='function')": split,
                     "DocumentSplitter(split_by='period', split_length=1)":
                         DocumentSplitter(split_by="period", split_length=1).run(whole)["documents"],
                     "whole passages": whole}
        else:
            units = {"whole passages": whole}

        sep = embedder.embedding_backend.model.tokenizer.sep_token
        embeddings = {"text only (default)": {}}
        if settings["embed_title"]:  # the title too: Haystack has no pair, only a separator within one segment
            embeddings.update({
                "meta_fields_to_embed=['title'] (separator '\\n')": {"meta_fields_to_embed": ["title"]},
                f"meta_fields_to_embed=['title'], embedding_separator=' {sep} '": {
                    "meta_fields_to_embed": ["title"], "embedding_separator": f" {sep} "}})
        for unit, documents in units.items():
            aligned = [(d.content, d.meta["passage_id"]) for d in documents] == [(t["text"], t["passage_id"])
                                                                                 for t in ours["texts"]]
            for setting, kwargs in embeddings.items():
                pair_ids = sep in kwargs.get("embedding_separator", "")
                for diagnostic in ((False, True) if aligned and pair_ids else (False,)):
                    doc_embedder = SentenceTransformersDocumentEmbedder(
                        model=f"{directory}/passage_encoder", device=cpu, progress_bar=False, local_files_only=True,
                        **kwargs)
                    doc_embedder.warm_up()
                    st = doc_embedder.embedding_backend.model  # shared by the embedders of this model: restored
                    if diagnostic:  # the pair's segments (0 title, 1 text), as the project's passage side encodes
                        preprocess, sep_id = st.preprocess, st.tokenizer.sep_token_id

                        def with_token_types(*args, **kw):
                            features = preprocess(*args, **kw)
                            features["token_type_ids"] = pair_token_types(features["input_ids"],
                                                                          features["attention_mask"], sep_id)
                            return features

                        st.preprocess = with_token_types
                    try:
                        embedded = doc_embedder.run(documents)["documents"]
                    finally:
                        st.__dict__.pop("preprocess", None)
                    store = InMemoryDocumentStore(embedding_similarity_function=similarity, shared=False)
                    store.write_documents(embedded)
                    pipe = Pipeline()
                    pipe.add_component("embedder", text_embedder())
                    pipe.add_component("retriever", InMemoryEmbeddingRetriever(store, top_k=len(embedded)))
                    pipe.connect("embedder.embedding", "retriever.query_embedding")
                    top1 = top5 = same_set = 0
                    score_diff = 0.0  # position-wise, top-5 scores: near-tied passages may swap, scores stay
                    passage_score_diff = 0.0  # the project's top-5 passages: Haystack's score of each vs ours
                    ranking = []
                    for q, hits in zip(questions, ours["top5"]):
                        ranked = {}  # passages by their best unit (MaxP), as the project ranks sentence windows
                        for doc in pipe.run({"embedder": {"text": q}})["retriever"]["documents"]:
                            ranked.setdefault(doc.meta["passage_id"], doc.score)
                        got, want = list(ranked)[:5], [pid for pid, _ in hits]
                        ranking.append([[pid, ranked[pid]] for pid in got])
                        top1 += got[:1] == want[:1]
                        top5 += got == want
                        same_set += set(got) == set(want)
                        score_diff = max(score_diff, max_diff([ranked[pid] for pid in got], [s for _, s in hits]))
                        passage_score_diff = max(passage_score_diff, max(abs(ranked[pid] - s) for pid, s in hits))
                    entry = {"questions": len(questions), "identical top-5": top5 / len(questions),
                             "identical top-1": top1 / len(questions), "same top-5 set": same_set / len(questions),
                             "max |score - ours| of our top-5 passages": passage_score_diff}
                    if aligned:
                        entry["max_abs_diff vs the project's embeddings"] = max_diff(
                            [d.embedding for d in embedded], ours["text_embeddings"])
                    label = f"{name}: {unit}, {setting}"
                    if not diagnostic:
                        rankings[label] = ranking
                    if diagnostic:
                        # The explanation checked: with the pair's segments the Haystack pipeline embeds and ranks
                        # exactly as the project.
                        # Rankings are compared by their scores: passages whose scores differ by float32
                        # rounding (SCORE_TOL) may swap.
                        entry["max top-5 score difference (position-wise)"] = score_diff
                        checks[f"{label} + token_type_ids 0/1 (diagnostic) = the project's ranking"] = {
                            **entry, "ok": score_diff <= SCORE_TOL
                            and entry["max_abs_diff vs the project's embeddings"] <= ATOL}
                    elif aligned and not settings["embed_title"]:
                        # Text alone, one segment: Haystack's default embeds exactly what the project does.
                        entry["max top-5 score difference (position-wise)"] = score_diff
                        checks[f"{label} = the project's ranking"] = {
                            **entry, "ok": score_diff <= SCORE_TOL
                            and entry["max_abs_diff vs the project's embeddings"] <= ATOL}
                    else:
                        checks[f"note: {label} vs the project's ranking"] = {**entry, "ok": True}
    return checks, rankings


def haystack3(out):
    """Haystack 3.x (haystack-ai) with the transformers-haystack and sentence-transformers-haystack integrations:
    the reader in TransformersExtractiveReader, both retrievers' sentence-transformers directories in the
    SentenceTransformers embedders with InMemoryDocumentStore and InMemoryEmbeddingRetriever."""
    reference = load_reference(out)
    retrieval_checks, rankings = haystack3_retrieval(out, reference)
    checks = {**haystack3_reader(out, reference), **retrieval_checks,
              **haystack3_snippet_checks(out, reference, rankings)}
    return {"step": "haystack3", "checks": checks,
            "versions": versions("haystack-ai", "transformers-haystack", "sentence-transformers-haystack", "torch",
                                 "transformers", "tokenizers", "huggingface_hub", "sentence-transformers")}
