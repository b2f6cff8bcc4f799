"""The `haystack` step of scripts/check_compat.py: the exported directories in Haystack 1.x (farm-haystack)."""

import os

from compat.common import ATOL, dev_questions, dpr_inputs, load_reference, max_diff, versions

# Imports inside the function: this environment has Haystack 1.x on transformers 4.51, not the project's
# dependencies.


def haystack(out):
    """Haystack 1.x: FARMReader on the reader directory, DensePassageRetriever on the DPR exports."""
    import numpy as np
    from haystack import Document
    from haystack.document_stores import InMemoryDocumentStore
    from haystack.nodes import DensePassageRetriever, FARMReader

    reference = load_reference(out)
    checks = {}
    reader = FARMReader(model_name_or_path=os.path.join(out, "reader"), use_gpu=False, max_seq_len=384,
                        doc_stride=128, progress_bar=False)
    agree, differ = 0, {}
    questions = dev_questions()
    for qid, question, context in questions:
        prediction = reader.predict(query=question, documents=[Document(content=context)], top_k=1)
        answer = prediction["answers"][0].answer if prediction["answers"] else None
        if answer == reference["best_span_any_length"][qid]:
            agree += 1
        else:
            differ[qid] = {"FARMReader": answer, "train_reader.py": reference["best_span_any_length"][qid]}
    checks["FARMReader answers = train_reader.py's best span of any length"] = {
        "questions": len(questions), "agree": agree, "differ": differ, "ok": not differ}

    dpr = os.path.join(out, "dpr")
    retriever = DensePassageRetriever(document_store=InMemoryDocumentStore(), use_gpu=False, progress_bar=False,
                                      query_embedding_model=f"{dpr}/dpr_question_encoder",
                                      passage_embedding_model=f"{dpr}/dpr_context_encoder")
    questions, passages = dpr_inputs()
    q_emb = retriever.embed_queries(questions)
    p_emb = retriever.embed_documents([Document(content=text, meta={"name": title}) for title, text in passages])
    ref = reference["dpr"]
    for name, got, key in (("embed_queries", q_emb, "haystack_question"),
                           ("embed_documents", p_emb, "haystack_context")):
        diff = max_diff(got, ref[key])
        checks[f"DensePassageRetriever.{name} = 5.x DPR classes on Haystack's inputs"] = {
            "max_abs_diff": diff, "ok": diff <= ATOL}
    # Not a check (always ok): how far Haystack's passage input (one segment) moves the embeddings train_dpr.py
    # trained, and whether each question's top passage (dot product, among these few) stays the same.
    q, p_haystack, p_ours = np.asarray(q_emb), np.asarray(p_emb), np.asarray(ref["dpr_context"])
    same_top = int((np.argmax(q @ p_haystack.T, 1) == np.argmax(q @ p_ours.T, 1)).sum())
    checks["note: Haystack passage embeddings vs train_dpr.py's (title/text segments 0/1)"] = {
        "max_abs_diff": max_diff(p_haystack, p_ours), "questions": len(questions), "same top passage": same_top,
        "ok": True}
    return {"step": "haystack", "versions": versions("farm-haystack", "torch", "transformers", "tokenizers",
                                                     "huggingface_hub", "sentence-transformers"),
            "checks": checks}
