"""A file of questions answered by the QA system across processes, and its answers written: each process retrieves
and reads its share (or, with an index spread over the processes, every process searches its shards for every
question), the results gathered on every process; predictions.json and details.jsonl (qa_system.py)."""

import os
import time

from accelerate.utils import gather_object

from utils.errors import UserError
from utils.files.jsonfiles import json_line, write_json
from utils.files.squad import load_questions
from utils.reader.trained import fingerprint, normalization
from utils.system.answer import READING_STATS, combine
from utils.system.measure import Setting, labelled
from utils.system.pipeline import QASystem, answer_of


def load_inputs(questions_file: str, validation_file: str | None, max_questions: int | None) -> tuple:
    """(the questions, the validation questions or None, whether they are the same questions): the first
    `max_questions` of `questions_file`; `validation_file` must be labelled (by SQuAD answers or answer strings:
    utils.files.squad.load_questions, the one loader)."""
    questions = load_questions(questions_file, need_context=False)[:max_questions]
    validation = None
    if validation_file:
        same_path = os.path.realpath(validation_file) == os.path.realpath(questions_file)
        validation = questions if same_path else load_questions(validation_file, need_context=False)
        if not labelled(validation):
            raise UserError(f"{validation_file}: the threshold is tuned on labelled questions (SQuAD JSON with "
                            "answers, or questions with their answer strings)")
    return questions, validation, validation is not None and fingerprint(validation) == fingerprint(questions)


def answer_all(accelerator, system: QASystem, questions: list[dict], k: int, bands: list[int]) -> tuple:
    """(retrieved, readings, seconds): this process's share of the questions retrieved at k and read band by band
    (passages 1..bands[0], then up to bands[1], ...), so the time to answer with each band's k is measured exactly;
    gathered on every process. With an index whose shards are spread over the processes, every process retrieves
    every question from its shards (a collective; the results merged), then reads its share."""
    spread = system.index is not None and system.index.distributed
    t0 = time.perf_counter()
    everything = system.retrieve([q["question"] for q in questions], k) if spread else None
    with accelerator.split_between_processes(list(range(len(questions)))) as share:
        mine = [questions[i] for i in share]
        texts = [q["question"] for q in mine]
        retrieved = [everything[i] for i in share] if spread else system.retrieve(texts, k) if texts else []
        seconds = {"retrieval": time.perf_counter() - t0}
        readings = [[] for _ in mine]
        first = 0
        for last in bands:
            t0 = time.perf_counter()
            part = system.read(texts, [passages[first:last] for passages in retrieved])
            for row, extra in zip(readings, part):
                row.extend(extra)
            seconds[f"read_{last}"] = time.perf_counter() - t0
            first = last
        results = [(q["id"], r, p) for q, r, p in zip(mine, retrieved, readings)]
    gathered = {i: (r, p) for i, r, p in gather_object(results)}
    times = gather_object([seconds])
    return [gathered[q["id"]][0] for q in questions], [gathered[q["id"]][1] for q in questions], times


def read_gold(accelerator, system: QASystem, questions: list[dict]) -> list[list[dict]]:
    """Each question's own paragraph read alone: the reader's score under the system's rule (its ceiling)."""
    with accelerator.split_between_processes(questions) as mine:
        gold = [[{"passage_id": "gold", "text": q["context"]}] for q in mine]
        part = system.read([q["question"] for q in mine], gold)
        results = [(q["id"], r) for q, r in zip(mine, part)]
    gathered = dict(gather_object(results))
    return [gathered[q["id"]] for q in questions]


def write_answers(accelerator, directory: str, questions: list[dict], retrieved: list[list[dict]],
                  readings: list[list[dict]], k: int, setting: Setting, shared_norm: bool) -> None:
    """predictions.json ({id: answer text}, the official SQuAD v2 evaluation's input) and details.jsonl: per
    question its answer at k, the passage it was taken from (and its source, where the corpus gives one) and
    its score (null on an abstention), its offsets in that passage, the log ratio the threshold compares
    (null_minus_best), and every passage read (retrieval score, best span, span and null scores, null for a passage
    without a span). `setting`: k's
    (utils.system.measure.Setting), as applied."""
    if not accelerator.is_main_process:
        return
    retriever_weight, threshold, calibration = setting.weight, setting.applied_threshold, setting.applied_calibration
    predictions = {}
    with open(os.path.join(directory, "details.jsonl"), "w", encoding="utf-8") as f:
        for q, passages, reads in zip(questions, retrieved, readings):
            combined = combine(reads[:k], shared_norm, retriever_weight=retriever_weight, calibration=calibration)
            a = answer_of(combined, threshold, passages[:k], reads[:k])
            predictions[q["id"]] = a["answer"]
            f.write(json_line({"id": q["id"], "question": q["question"], "answer": a["answer"],
                               "passage_id": a["passage_id"], "source": a["source"], "score": a["score"],
                               "start": a["start"],
                               "end": a["end"], "null_minus_best": a["null_minus_best"],
                               "no_answer_probability": a["no_answer_probability"], "top_k": k,
                               "rule": normalization(shared_norm),
                               "passages": [{"passage_id": p["passage_id"], "score": p["score"], "span": r["text"],
                                             "span_score": r["score"], "null_score": r["null_score"],
                                             "nbest": [{"text": x["text"], "score": x["score"]} for x in r["nbest"]],
                                             **{k: r[k] for k in READING_STATS}}
                                            for p, r in zip(passages, reads)]}) + "\n")
    write_json(accelerator, os.path.join(directory, "predictions.json"), predictions)
