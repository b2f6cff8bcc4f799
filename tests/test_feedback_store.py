"""The feedback store on both of its databases, each real: a SQLite file, and a throwaway PostgreSQL server
(tests/postgres.py). Labels are written whole or not at all (a writer killed inside its transaction leaves none),
concurrent writers in separate processes lose none, and pages read every label once, in the order written."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from conftest import ROOT
from postgres import Postgres
from utils.errors import UserError
from utils.feedback.store import FeedbackStore


@pytest.fixture(scope="module")
def postgres():
    server = Postgres()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def where(request, tmp_path):
    """A new, empty store's --feedback_db: a SQLite file, or a database of the throwaway PostgreSQL server."""
    if request.param == "sqlite":
        return str(tmp_path / "feedback.sqlite")
    return request.getfixturevalue("postgres").database("t" + uuid.uuid4().hex[:12])


def label(question: str, **extra) -> dict:
    return {"question": question, "verdict": "span", "passage_id": "p1", "title": "T", "text": "Paris is in France.",
            "document": "a.html", "answer_start": 0, "answer_end": 5, "answer": "Paris", "given": "France",
            "given_passage_id": "p1", "index_version": 3, "reader": "f" * 32,
            "shown": [{"passage_id": "p1", "title": "T", "text": "Paris is in France.", "document": "a.html"}],
            **extra}


def in_child(where: str, body: str, *args, open_first: bool = True) -> subprocess.Popen:
    code = textwrap.dedent(f"""
        import os, sys, time
        from utils.feedback.store import FeedbackStore
        store = FeedbackStore({where!r}) if {open_first} else None
    """) + textwrap.dedent(body)
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT})


def test_a_label_is_stored_as_given_and_read_back_a_page_at_a_time(where):
    store = FeedbackStore(where)
    written = [store.add(label(f"q{i}", verdict="no_answer" if i % 3 == 0 else "span")) for i in range(7)]
    assert [w["id"] for w in written] == sorted({w["id"] for w in written})
    first, total = store.page(0, 3)
    assert total == 7 and [r["question"] for r in first] == ["q0", "q1", "q2"]
    assert first[1] == {**label("q1"), "id": written[1]["id"], "created": written[1]["created"]}
    assert first[1]["created"].endswith("+00:00") and first[1]["shown"][0]["document"] == "a.html"
    rest, _ = store.page(first[-1]["id"], 100)
    assert [r["question"] for r in rest] == [f"q{i}" for i in range(3, 7)]
    assert [r["question"] for r in store] == [f"q{i}" for i in range(7)]
    store.close()
    again = FeedbackStore(where)  # opened again (a restarted server): the same labels, nothing created twice
    assert again.page(0, 100)[1] == 7
    again.close()


def test_a_writer_killed_inside_its_transaction_leaves_no_label(where):
    store = FeedbackStore(where)
    store.add(label("before"))
    child = in_child(where, """
        from utils.feedback.store import LABELS
        with store.engine.begin() as conn:
            conn.execute(LABELS.insert().values(question="half", verdict="span", reader="r", shown="[]",
                                                created="2026-01-01T00:00:00+00:00"))
            print("inserted, not committed", flush=True)
            time.sleep(120)
    """)
    assert child.stdout.readline().strip() == "inserted, not committed", child.stderr.read()
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    labels, total = store.page(0, 100)
    assert total == 1 and [r["question"] for r in labels] == ["before"]
    store.add(label("after"))  # the killed writer's lock is gone: the store takes labels on
    assert [r["question"] for r in store] == ["before", "after"]
    store.close()


def test_concurrent_writers_in_separate_processes_lose_no_label(where):
    FeedbackStore(where).close()  # created once; the writers open it as several servers would
    writers = [in_child(where, """
        for i in range(30):
            store.add({"question": f"{sys.argv[1]}-{i}", "verdict": "wrong", "given": "x", "reader": "r",
                       "shown": []})
        print("done", flush=True)
    """, w) for w in range(4)]
    for w in writers:
        out, err = w.communicate(timeout=300)
        assert w.returncode == 0 and out.strip() == "done", err[-2000:]
    store = FeedbackStore(where)
    labels = list(store)
    assert len(labels) == 120 and len({r["id"] for r in labels}) == 120
    assert {r["question"] for r in labels} == {f"{w}-{i}" for w in range(4) for i in range(30)}
    for w in range(4):  # each writer's labels in the order it wrote them
        mine = [int(r["question"].split("-")[1]) for r in labels if r["question"].startswith(f"{w}-")]
        assert mine == sorted(mine)
    store.close()


def test_a_bad_database_is_a_one_line_error(tmp_path):
    with pytest.raises(UserError, match="no such directory"):
        FeedbackStore(str(tmp_path / "missing" / "feedback.sqlite"))
    with pytest.raises(UserError, match="not a database URL or file"):
        FeedbackStore("nosuchdb://x/y")
    (tmp_path / "notadb.sqlite").write_text("hello, this is not SQLite " * 100)
    with pytest.raises(UserError, match="cannot open it"):
        FeedbackStore(str(tmp_path / "notadb.sqlite"))
    with pytest.raises(UserError, match="cannot open it"):  # nobody listens there
        FeedbackStore("postgresql+psycopg://qa@127.0.0.1:1/postgres?connect_timeout=5")


def test_servers_opening_a_new_store_at_once_all_open_it(where, tmp_path):
    """Several servers started together on a database no store has been made in: each opens it (the tables made
    once), none fails on another's creation."""
    go = tmp_path / "go"
    openers = [in_child(where, f"""
        while not os.path.exists({str(go)!r}):  # every child imported and waiting: they open together
            time.sleep(0.005)
        FeedbackStore({where!r})
        print("open", flush=True)
    """, open_first=False) for _ in range(6)]
    time.sleep(3)
    go.write_text("")
    for child in openers:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0 and out.strip() == "open", err[-2000:]
    store = FeedbackStore(where)
    assert store.page(0, 10) == ([], 0)
    store.close()


def test_labels_commit_in_the_order_of_their_ids_so_paging_misses_none(where):
    """A label written while another writer's transaction is open gets a later id and commits after it: a reader
    paging `after` the last id it saw never skips a label committed later with a smaller id."""
    store = FeedbackStore(where)
    child = in_child(where, """
        from utils.feedback.store import LABELS
        with store.engine.begin() as conn:
            store._serialized(conn)
            conn.execute(LABELS.insert().values(question="first", verdict="wrong", reader="r", shown="[]",
                                                created="2026-01-01T00:00:00+00:00"))
            print("inserted, not committed", flush=True)
            time.sleep(3)
        print("committed", flush=True)
    """)
    assert child.stdout.readline().strip() == "inserted, not committed", child.stderr.read()
    second = store.add(label("second"))  # waits for the first to commit (PostgreSQL: the writers' lock; SQLite's)
    assert child.stdout.readline().strip() == "committed" and child.wait() == 0
    labels = list(store)
    assert [r["question"] for r in labels] == ["first", "second"] and labels[-1]["id"] == second["id"]
    store.close()
