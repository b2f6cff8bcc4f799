"""A trained reader fine-tuned further (on its users' labels, export_feedback.py's squad.json): train_reader.py
continues it with its recorded answer rule (shared normalization over as many passages a question) and windows,
unless a flag says otherwise; without the corpus that rule needs it says so in one line. scripts/finetune_on_labels.py
chooses the fine-tuned reader's threshold by cross-validation over folds of whole documents."""

import json
import os
import tempfile

from conftest import SAMPLE, assert_user_error, run_script
from utils.files.folds import article_of
from utils.files.squad import load_squad, squad_document
from utils.reader.metrics import best_null_threshold
from utils.reader.trained import Reader

STEPS = ["--max_train_steps", 2, "--per_device_train_batch_size", 4, "--eval_before_training", "false",
         "--train_file", f"{SAMPLE}/train.json", "--validation_file", f"{SAMPLE}/dev.json"]


def settings(directory):
    with open(os.path.join(directory, "reader_settings.json")) as f:
        return json.load(f)


def test_a_trained_reader_continues_with_its_answer_rule_unless_told(shared_reader_dir, tmp_path):
    recorded = settings(shared_reader_dir)
    assert recorded["normalization"] == "question" and recorded["passages_per_question"] == 3
    proc = run_script("train_reader.py", "--model_name_or_path", shared_reader_dir, "--output_dir", tmp_path / "no",
                      *STEPS, check=False)
    assert_user_error(proc, "reads with shared normalization over 3 passages a question")
    assert not os.path.exists(tmp_path / "no" / "reader_settings.json")

    run_script("train_reader.py", "--model_name_or_path", shared_reader_dir, "--output_dir", tmp_path / "same",
               "--passages", f"{SAMPLE}/dpr_passages.jsonl", *STEPS)
    same = settings(tmp_path / "same")
    assert (same["normalization"], same["passages_per_question"]) == ("question", 3)
    assert {k: same[k] for k in ("max_seq_length", "doc_stride", "max_answer_length")} == \
        {k: recorded[k] for k in ("max_seq_length", "doc_stride", "max_answer_length")}

    run_script("train_reader.py", "--model_name_or_path", shared_reader_dir, "--output_dir", tmp_path / "window",
               "--passages_per_question", 1, *STEPS)
    window = settings(tmp_path / "window")
    assert (window["normalization"], window["passages_per_question"]) == ("window", 1)


def test_fine_tuning_on_labels_chooses_its_threshold_on_documents_each_reader_never_saw(trained_models, tmp_path):
    """scripts/finetune_on_labels.py on the sample's labelled questions (10 documents, 3 folds): every label read by
    a fold's reader that did not train on its document; the threshold published with the final reader is the one
    the official rule tunes on those readings; the final reader's in-sample results are left out."""
    reader, out = trained_models[0], tmp_path / "reader-labels"
    examples, _ = load_squad(f"{SAMPLE}/train.json")
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps(squad_document(examples)))
    before = set(os.listdir(tempfile.gettempdir()))
    run_script("scripts/finetune_on_labels.py", "--reader", reader, "--labels", labels, "--output_dir", out,
               "--folds", 3, "--", "--max_train_steps", 2, "--per_device_train_batch_size", 8)
    report = json.loads((out / "finetune.json").read_text())
    document = {ex["id"]: article_of(ex) for ex in examples}
    assert report["folds"] == 3 and set(report["readings"]) == set(document)
    assert report["questions"] == len(examples)
    for qid, reading in report["readings"].items():
        assert document[qid] not in report["trained_on"][reading["fold"]]
    read = report["readings"]
    _, threshold = best_null_threshold({ex["id"]: ex["answers"]["text"] for ex in examples},
                                       {q: r["text"] for q, r in read.items()},
                                       {q: r["null_minus_best"] for q, r in read.items()})
    recorded = settings(out)
    assert recorded["null_threshold"] == report["threshold"] == threshold
    assert "cross-validated over 3 folds of whole documents" in recorded["null_threshold_tuned_on"]["data"]
    assert not (out / "eval_results.json").exists() and (out / "model.safetensors").exists()
    assert Reader.files_fingerprint(str(out)) != Reader.files_fingerprint(reader)
    rows = report["out_of_fold"]
    assert set(rows) == {"reader_as_it_was", "reader_as_it_was_threshold_cross_validated",
                         "fine_tuned_threshold_cross_validated"}
    assert not [n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("qa-amp-finetune-")]

    proc = run_script("scripts/finetune_on_labels.py", "--reader", reader, "--labels", labels, "--output_dir", out,
                      check=False)  # a trained model there: refused, as every script refuses it
    assert_user_error(proc, "holds a trained model")
    proc = run_script("scripts/finetune_on_labels.py", "--reader", reader, "--labels", labels, "--output_dir", reader,
                      check=False)
    assert_user_error(proc, "the fine-tuned reader never replaces the one it starts from")
    proc = run_script("scripts/finetune_on_labels.py", "--reader", reader, "--labels", labels, "--output_dir",
                      tmp_path / "y", "--", "--eval_steps", 5, check=False)
    assert_user_error(proc, "choose a checkpoint on the held-out fold's labels")
    one = tmp_path / "one.json"
    one.write_text(json.dumps(squad_document([ex for ex in examples if document[ex["id"]] == document[examples[0]
                                                                                                        ["id"]]])))
    proc = run_script("scripts/finetune_on_labels.py", "--reader", reader, "--labels", one, "--output_dir",
                      tmp_path / "x", check=False)
    assert_user_error(proc, "cross-validation over documents needs two")
