"""A trained reader fine-tuned further (on its users' labels, export_feedback.py's squad.json): train_reader.py
continues it with its recorded answer rule (shared normalization over as many passages a question) and windows,
unless a flag says otherwise; without the corpus that rule needs it says so in one line."""

import json
import os

from conftest import SAMPLE, assert_user_error, run_script

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
