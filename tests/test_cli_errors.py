"""Bad command lines end in one `error:` line and exit status 2, before any training: real subprocesses.

Every run would train (briefly, on the tiny BERT) if its check were missing, so a missing check shows up
as exit status 0 or a traceback, not as a hang. A run is ~5 s of imports for a few ms of work, so the
selected runs go two at a time, started by the first test that needs one.
"""

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import assert_user_error, run_script
from transformers import AutoTokenizer, RobertaConfig

from train_reader import FLAGS as READER_FLAGS
from utils.errors import UserError
from utils.runtime.flags import parse_args


def quick_run(script, model_dir, out):
    """Should a check be missing, the run finishes in seconds instead of failing."""
    model = (["--model_name_or_path", model_dir] if script == "train_reader.py"
             else ["--query_model_name_or_path", model_dir, "--passage_model_name_or_path", model_dir])
    return [*model, "--output_dir", out, "--per_device_train_batch_size", 8, "--max_train_samples", 16,
            "--max_eval_samples", 8, "--max_train_steps", 1, "--eval_before_training", "false"]


# id: (script, flags after the quick-run ones, the error line, refused while parsing the flags)
CASES = {
    "reader-unknown-flag": ("train_reader.py", ["--learning_rte", "1e-4"],
                            "error: unknown flag --learning_rte (did you mean --learning_rate?)", True),
    "dpr-unknown-flag": ("train_dpr.py", ["--max_pasage_length=300"],
                         "error: unknown flag --max_pasage_length (did you mean --max_passage_length?)", True),
    "reader-stray-argument": ("train_reader.py", ["data/sample/train.json"],
                              "error: unexpected argument 'data/sample/train.json'", True),
    "dpr-stray-argument": ("train_dpr.py", ["data/sample/dpr_train.json"],
                           "error: unexpected argument 'data/sample/dpr_train.json'", True),
    "reader-epochs": ("train_reader.py", ["--num_train_epochs", "-1"],
                      "error: --num_train_epochs must be positive (got -1.0)", True),
    "dpr-epochs": ("train_dpr.py", ["--num_train_epochs", "0"],
                   "error: --num_train_epochs must be positive (got 0.0)", True),
    # under a regular file (the second --output_dir wins)
    "reader-output-dir": ("train_reader.py", ["--output_dir", "{tmp}/a_file/out"],
                          "error: {tmp}/a_file/out: cannot create the output directory (Not a directory)", False),
    "dpr-output-dir": ("train_dpr.py", ["--output_dir", "{tmp}/a_file/out"],
                       "error: {tmp}/a_file/out: cannot create the output directory (Not a directory)", False),
    # the tiny BERT has 512 positions
    "reader-max-seq-length": ("train_reader.py", ["--max_seq_length", "100000"],
                              "error: --max_seq_length 100000 is more than the 512 tokens {model} can take", False),
    "dpr-max-query-length": ("train_dpr.py", ["--max_query_length", "520"],
                             "error: --max_query_length 520 is more than the 512 tokens {model} can take", False),
    "dpr-max-passage-length": ("train_dpr.py", ["--max_passage_length", "100000"],
                               "error: --max_passage_length 100000 is more than the 512 tokens {model} can take",
                               False),
    # a missing file is what the error names, before any other check (here: the missing --validation_file)
    "reader-missing-train-file": ("train_reader.py", ["--train_file", "{tmp}/nope.json"],
                                  "error: --train_file {tmp}/nope.json: no such file", True),
    "dpr-directory-as-file": ("train_dpr.py", ["--passages", "{tmp}"],
                              "error: --passages {tmp}: is a directory, not a file", True),
    "reader-missing-resume-path": ("train_reader.py", ["--resume_from_checkpoint", "{tmp}/ckpt"],
                                   "error: --resume_from_checkpoint {tmp}/ckpt: no such directory", True),
    "reader-empty-model-dir": ("train_reader.py", ["--model_name_or_path", "{tmp}/empty"],
                               "error: --model_name_or_path {tmp}/empty: not a model directory (no config.json)", True),
    "dpr-empty-model-dir": ("train_dpr.py", ["--passage_model_name_or_path", "{tmp}/empty"],
                            "error: --passage_model_name_or_path {tmp}/empty: not a model directory (no config.json)",
                            True),
}


@pytest.fixture(scope="module")
def runs(request, tiny_bert_dir, tmp_path_factory):
    """id -> (future CompletedProcess, output dir, tmp dir) for every selected case, two running at a time."""
    selected = [item.callspec.params["case"] for item in request.session.items
                if item.module is request.module and "case" in getattr(getattr(item, "callspec", None), "params", {})]
    pool = ThreadPoolExecutor(max_workers=2)
    started = {}
    for case in selected:
        script, extra, _, _ = CASES[case]
        tmp = tmp_path_factory.mktemp(case)
        (tmp / "a_file").write_text("a regular file, not a directory")
        (tmp / "empty").mkdir()
        out = str(tmp / "out")
        argv = quick_run(script, tiny_bert_dir, out) + [a.format(tmp=tmp) for a in extra]
        started[case] = (pool.submit(run_script, script, *argv, check=False), out, tmp)
    yield started
    pool.shutdown(cancel_futures=True)


@pytest.mark.parametrize("case", CASES)
def test_bad_command_line_is_one_error_line_before_training(runs, tiny_bert_dir, case):
    script, _, expected, at_parse_time = CASES[case]
    future, out, tmp = runs[case]
    proc = future.result()
    assert_user_error(proc, expected.format(tmp=tmp, model=tiny_bert_dir))
    assert "before training" not in proc.stdout and "after training" not in proc.stdout
    for name in ("config.json", "model.safetensors", "query_encoder", "passage_encoder"):
        assert not os.path.exists(os.path.join(out, name)), name
    if at_parse_time:
        assert not os.path.exists(out)  # refused before setup creates the output directory


@pytest.mark.parametrize("argv, expected", [
    (["--xyzzy", "1"], "unknown flag --xyzzy"),  # nothing close: no suggestion
    (["--learning-rte", "1e-4", "stray"], "unknown flag --learning-rte (did you mean --learning_rate?)"),
    (["--learning_rate", "abc"], "argument --learning_rate/--learning-rate: invalid float value: 'abc'"),
    (["--lr_scheduler_type", "cosin"], "invalid choice: 'cosin'"),
    (["--max_train_steps", "5", "--num_train_epochs", "-0.5"], "--num_train_epochs must be positive (got -0.5)"),
])
def test_parse_errors_are_one_line_user_errors(argv, expected):
    with pytest.raises(UserError) as err:
        parse_args(READER_FLAGS, argv)
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert ("did you mean" in expected) == ("did you mean" in str(err.value))


def help_text(classes, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        parse_args(classes, ["--help"])
    assert exit_.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_a_percent_sign_in_a_help_text_is_shown_as_written(capsys):
    from dataclasses import dataclass

    from utils.loop.config import LoopConfig
    from utils.runtime.flags import arg

    @dataclass(frozen=True)
    class Loop(LoopConfig):  # argparse %-formats help texts: a bare "%" made --help crash
        output_dir: str = arg("out", "Keep 15% of it.")
        metric_for_best_model: str = arg("f1", "Metric.")

    assert "Keep 15% of it." in help_text((Loop,), capsys)
    assert "Keep the pretrained word-embedding matrix fixed" in help_text(READER_FLAGS, capsys)


def test_help_says_what_each_flag_does(capsys):
    from train_dpr import FLAGS as DPR_FLAGS

    reader, dpr = help_text(READER_FLAGS, capsys), help_text(DPR_FLAGS, capsys)
    # the --no_ twin of a boolean flag says what it does, not the positive flag's help with "(default: False)"
    assert "--no_do_train, --no-do-train Same as --do_train false. --mixed_precision" in reader
    assert "--no_embed_title, --no-embed-title Same as --embed_title false. --window_sentences" in dpr
    assert "'cls' (the first token's, as in DPR) or 'mean'" in dpr and "'dot' (inner product, DPR)" in dpr
    assert "exact, f1, HasAns_exact, HasAns_f1, NoAns_exact, NoAns_f1" in reader and "tuned_f1" in reader
    assert "mean_rank, in_batch_avg_rank (lower is better)" in dpr


def test_max_length_limit_comes_from_the_model_and_its_tokenizer(tiny_bert_dir, tokenizer, tmp_path):
    from utils.max_length import check_max_length

    check_max_length(tiny_bert_dir, tokenizer, max_seq_length=512)  # exactly the 512 positions: fine
    with pytest.raises(UserError, match="--max_seq_length 513 is more than the 512 tokens"):
        check_max_length(tiny_bert_dir, tokenizer, max_seq_length=513)
    # A tokenizer that declares a smaller maximum than the positions wins; every flag given is checked.
    short = AutoTokenizer.from_pretrained(tiny_bert_dir, model_max_length=128)
    with pytest.raises(UserError, match="--max_query_length 129 is more than the 128 tokens"):
        check_max_length(tiny_bert_dir, short, max_passage_length=128, max_query_length=129)
    # RoBERTa numbers positions from pad_token_id + 1: 514 embeddings, pad 1 -> 512 usable. A tokenizer's
    # "no limit" placeholder (1e30) is no limit.
    RobertaConfig(max_position_embeddings=514, pad_token_id=1).save_pretrained(tmp_path / "roberta")
    unbounded = AutoTokenizer.from_pretrained(tiny_bert_dir, model_max_length=int(1e30))
    check_max_length(str(tmp_path / "roberta"), unbounded, max_seq_length=512)
    with pytest.raises(UserError, match="--max_seq_length 513 is more than the 512 tokens"):
        check_max_length(str(tmp_path / "roberta"), unbounded, max_seq_length=513)
