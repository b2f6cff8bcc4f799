"""The one atomic writer (utils/runtime/atomic.py) as ingest_documents.py and every JSON file use it: a temporary file
of a name of its own (a user's file of the old fixed name is never touched), removed on every way out, SIGTERM
included, and a name that cannot be written refused in one line before anything is read."""

import os
import signal
import subprocess
import sys
import time

from conftest import ROOT, assert_user_error, run_script

from utils.files.jsonfiles import write_json_lines

# a writer that writes one row, then waits to be stopped
SLOW_WRITER = """
import sys, time
sys.path.insert(0, {root!r})
from utils.files.jsonfiles import write_json_lines
def rows():
    yield {{"text": "new"}}
    open({started!r}, "w").close()
    time.sleep(60)
    yield {{"text": "never"}}
write_json_lines({path!r}, rows())
"""


def test_a_users_file_of_the_temporary_name_is_never_touched(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("The lamp was lit at dusk.\n")
    mine = tmp_path / "corpus.jsonl.tmp"
    mine.write_text("a user's own file\n")
    run_script("ingest_documents.py", "--documents", tmp_path / "docs", "--output", tmp_path / "corpus.jsonl")
    assert mine.read_text() == "a user's own file\n"
    assert sorted(os.listdir(tmp_path)) == ["corpus.jsonl", "corpus.jsonl.tmp", "docs"]


def test_two_writers_of_one_file_each_write_their_own_temporary_file(tmp_path):
    path = str(tmp_path / "out.jsonl")

    def rows(text):
        yield {"text": text}
        if text == "outer":  # the inner writer runs while the outer one is half way
            write_json_lines(path, rows("inner"))
        yield {"text": text}

    write_json_lines(path, rows("outer"))
    assert open(path).read() == '{"text": "outer"}\n' * 2 and os.listdir(tmp_path) == ["out.jsonl"]


def test_sigterm_during_a_write_leaves_the_file_as_it_was_and_no_temporary_file(tmp_path):
    path, started = tmp_path / "out.jsonl", tmp_path / "started"
    path.write_text('{"text": "old"}\n')
    code = SLOW_WRITER.format(root=ROOT, started=str(started), path=str(path))
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.time() + 60
    while not started.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    started.unlink()
    assert os.listdir(tmp_path) == ["out.jsonl"] and path.read_text() == '{"text": "old"}\n'


def test_an_output_that_cannot_be_written_is_one_line_before_anything_is_read(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("The lamp was lit at dusk.\n")
    long_name = tmp_path / ("c" * 300 + ".jsonl")
    for output in ("/proc/corpus.jsonl", long_name):
        proc = run_script("ingest_documents.py", "--documents", tmp_path / "docs", "--output", output, check=False)
        assert_user_error(proc, f"{output}: cannot write it")
    assert sorted(os.listdir(tmp_path)) == ["docs"]
