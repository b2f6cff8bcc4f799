"""The feedback store: the labels users give the served answers, in a real database through one code path
(SQLAlchemy Core): a SQLite file by default (embedded, nothing to start), or a PostgreSQL URL that several server
processes or machines share.

Each label is one row written in one transaction: a writer killed part-way leaves no half label, and concurrent
writers (threads of a server, several servers) lose none (SQLite: WAL and a busy timeout; PostgreSQL: its own
transactions). Rows are read back in the order written, a page at a time (`page(after, limit)`), by their id.
"""

import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone

import sqlalchemy as sa
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from utils.errors import UserError
from utils.runtime.flags import arg

# What a user said of an answer (the page's buttons, POST /feedback's "verdict"): a span verdict ("right": the answer
# given is the span; "span": the user selected the answer in a passage shown) is a label of where the answer is;
# "no_answer": no passage shown answers the question, a label too; "wrong" without a span is counted, not a label.
VERDICTS = ("right", "wrong", "span", "no_answer")
SCHEMA_VERSION = 1
ADVISORY_LOCK = 0x7161616D70  # PostgreSQL's lock of the store's writers ("qaamp")

METADATA = sa.MetaData()
LABELS = sa.Table(
    "qa_amp_feedback", METADATA,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("created", sa.String(32), nullable=False),  # UTC, ISO 8601 to the millisecond
    sa.Column("question", sa.Text, nullable=False),
    sa.Column("verdict", sa.String(16), nullable=False),
    # the passage the label is about (the answer's, or the span's): as it was read, with where it came from
    sa.Column("passage_id", sa.Text),
    sa.Column("title", sa.Text),
    sa.Column("text", sa.Text),
    sa.Column("document", sa.Text),
    sa.Column("answer_start", sa.Integer),  # the span's character offsets in `text` ([start, end))
    sa.Column("answer_end", sa.Integer),
    sa.Column("answer", sa.Text),  # text[answer_start:answer_end]
    # what the system had answered, and with what
    sa.Column("given", sa.Text),  # its answer ("" when it abstained)
    sa.Column("given_passage_id", sa.Text),
    sa.Column("index_version", sa.Integer),
    sa.Column("reader", sa.String(64), nullable=False),  # the reader's fingerprint (a hash of its directory's files)
    # every passage shown, as read: [{"passage_id", "title", "text", "document"}] (JSON): the negatives of a label
    sa.Column("shown", sa.Text, nullable=False),
)
META = sa.Table("qa_amp_feedback_schema", METADATA, sa.Column("version", sa.Integer, nullable=False))
FIELDS = [c.name for c in LABELS.columns]


@dataclass(frozen=True)
class FeedbackDB:
    """The feedback store: serve.py keeps the labels users give its answers there, export_feedback.py reads them."""
    feedback_db: str = arg("feedback.sqlite", "The labels' database: a SQLite file, or a SQLAlchemy URL such as "
                                              "postgresql+psycopg://user@host/db, which several servers can share "
                                              "(serve.py creates it where missing, none: keeps no labels; "
                                              "export_feedback.py only reads it). A password is best left out of "
                                              "the URL, which `ps` shows: PGPASSWORD or ~/.pgpass.")


@dataclass(frozen=True)
class FeedbackConfig(FeedbackDB):
    """Where serve.py keeps the labels users give its answers (POST /feedback and the page's buttons), and who may
    give and read them."""
    feedback_token_file: str | None = arg(None, "A file holding the token /feedback requires (`Authorization: "
                                                "Bearer TOKEN`; or the environment's QA_AMP_FEEDBACK_TOKEN): needed "
                                                "to give or read labels on any --host but this machine's loopback.")


def displayed(where: str) -> str:
    """The store as messages and outputs name it: a file's path, a URL without its password."""
    if "://" not in where:
        return where
    try:
        return sa.engine.make_url(where).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):  # not a URL SQLAlchemy reads: what precedes a host is left out
        scheme, _, rest = where.partition("://")
        return f"{scheme}://***@{rest.rpartition('@')[2]}" if "@" in rest else where


def database_url(where: str) -> str:
    """A SQLAlchemy URL for `where`: a URL as given, else a SQLite file's path."""
    return where if "://" in where else "sqlite:///" + os.path.abspath(where)


def _sqlite_pragmas(dbapi_connection, _record):
    # WAL: readers never wait for the writer; busy_timeout: a writer waits for another's lock (a second server on
    # the same file) instead of failing at once; synchronous=FULL: a committed label survives a power cut
    cursor = dbapi_connection.cursor()
    for pragma in ("journal_mode=WAL", "busy_timeout=30000", "synchronous=FULL"):
        cursor.execute(f"PRAGMA {pragma}")
    cursor.close()


class FeedbackStore:
    """The labels in the database at `where` (a SQLite path or a SQLAlchemy URL), its table created if missing.
    `add(label)` writes one in a transaction and returns its id; `page(after, limit)` reads them back in order."""

    def __init__(self, where: str, create: bool = True):
        """`create` False: a store that must exist already (export_feedback.py reads one): a SQLite file that is not
        there, or a database without the labels' table, is refused, and nothing is created in it."""
        self.url, name = database_url(where), displayed(where)  # name: the URL without its password
        try:
            self.engine = sa.create_engine(self.url, pool_pre_ping=True)
        except (ArgumentError, ImportError, ValueError) as err:
            raise UserError(f"--feedback_db {name}: not a database URL or file ({one_line(err)})") from None
        self.kind = self.engine.dialect.name
        if self.kind == "sqlite":
            path = os.path.abspath(self.engine.url.database or "")
            if not os.path.isdir(os.path.dirname(path)):
                raise UserError(f"--feedback_db {name}: no such directory {os.path.dirname(path)}")
            if os.path.isdir(path):
                raise UserError(f"--feedback_db {name}: is a directory, not a file")
            if not create and not os.path.isfile(path):
                raise UserError(f"--feedback_db {name}: no such file")
            sa.event.listen(self.engine, "connect", _sqlite_pragmas)
        for attempt in range(3):  # servers sharing a new database may all create it at once: the others then find it
            try:
                found = self._open(name, create)
                break
            except SQLAlchemyError as err:
                if attempt == 2:
                    raise UserError(f"--feedback_db {name}: cannot open it ({one_line(err)})") from None
        if found not in (None, SCHEMA_VERSION):
            raise UserError(f"--feedback_db {name}: its labels are of schema version {found}, this version of "
                            f"qa-amp reads {SCHEMA_VERSION}")

    def _open(self, name: str, create: bool):
        """The tables checked (and created where missing and `create`) in one transaction: the schema's version."""
        with self.engine.begin() as conn:
            self._serialized(conn)
            if not create and not sa.inspect(conn).has_table(LABELS.name):
                raise UserError(f"--feedback_db {name}: holds no feedback labels (no table {LABELS.name}): not a "
                                "store serve.py wrote")
            METADATA.create_all(conn)  # only what is missing
            found = conn.execute(sa.select(META.c.version)).scalar()
            if found is None:
                conn.execute(META.insert().values(version=SCHEMA_VERSION))
        return found

    def _serialized(self, conn) -> None:
        """PostgreSQL: this transaction waits for the others of the store to end (a lock held until it ends), so
        that labels commit in the order of their ids (a reader paging `after` an id misses none written before it)
        and servers starting at once create the tables once. SQLite has one writer at a time already."""
        if self.kind == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK})

    def add(self, label: dict) -> dict:
        """Writes `label` (FIELDS but id and created; "shown" a list) in one transaction: the row as stored."""
        row = {**{name: label.get(name) for name in FIELDS if name not in ("id", "created")},
               "created": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
               "shown": json.dumps(label["shown"], ensure_ascii=False)}
        with self.engine.begin() as conn:
            self._serialized(conn)
            row["id"] = conn.execute(LABELS.insert().values(**row)).inserted_primary_key[0]
        return as_label(row)

    def page(self, after: int = 0, limit: int = 100) -> tuple[list[dict], int]:
        """The labels with ids above `after`, in the order written, at most `limit`; and how many there are in all."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(LABELS).where(LABELS.c.id > after).order_by(LABELS.c.id).limit(limit))
            labels = [as_label(r._asdict()) for r in rows]
            total = conn.execute(sa.select(sa.func.count()).select_from(LABELS)).scalar_one()
        return labels, total

    def __iter__(self):
        """Every label, in the order written, a page at a time (the export reads the store so, whatever its size)."""
        after = 0
        while True:
            labels, _ = self.page(after, 1000)
            yield from labels
            if len(labels) < 1000:
                return
            after = labels[-1]["id"]

    def close(self) -> None:
        self.engine.dispose()


def as_label(row: dict) -> dict:
    return {**row, "shown": json.loads(row["shown"]) if isinstance(row["shown"], str) else row["shown"]}


def one_line(err: Exception) -> str:
    return str(getattr(err, "orig", None) or err).strip().splitlines()[0]
