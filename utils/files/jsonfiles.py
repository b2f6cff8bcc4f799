"""JSON files in and out. Reading: a missing, unreadable or malformed file is a one-line UserError naming the file
(and, for JSON lines, the line). JSON lines are read by one reader (`json_lines`, `parse_json_line`), for a whole
file (`read_json`) as for a byte range of a corpus streamed in shards (utils.files.corpus.stream_passages): lines
end at "\n" only, as JSON lines defines them (U+2028, U+2029 and U+0085, which str.splitlines also breaks at, are
legal raw inside a JSON string), and a line of JSON whitespace only is blank, skipped but counted. Writing: strict
JSON, which most JSON readers require: Python's json would write Infinity and NaN for numbers that are not finite;
they are written as null. Every JSON file of the project is written by `write_json_file`, a JSON-lines corpus by
`write_json_lines`, both by the one atomic writer (utils.runtime.atomic), so that a reader (or a resumed job after a
crash) never sees half a file."""

import json
import math
import os

import numpy as np

from utils.errors import UserError
from utils.runtime.atomic import atomic_file


def read_json(path: str, line_numbers: bool = False):
    """A JSON file, or a list of JSON lines: a *.jsonl file, or a .json file that holds one JSON value per line
    (what datasets' Dataset.to_json writes). A missing, unreadable or malformed file is a UserError that names the
    file and, for JSON lines, the line. With `line_numbers`: (value, the file line of each row of a JSON-lines file,
    None for a JSON document), so that later checks can name the line too."""
    if os.path.isdir(path):
        raise UserError(f"{path}: is a directory, not a file")
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such file")
    if not path.endswith(".jsonl"):  # a JSON document, or JSON lines under a .json name (read again below)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError as err:
            raise UserError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
        except OSError as err:
            raise UserError(f"{path}: cannot read it ({err.strerror or err})") from None
        try:
            return (json.loads(text), None) if line_numbers else json.loads(text)
        except json.JSONDecodeError as err:
            if err.msg != "Extra data":  # "Extra data": more than one value, i.e. JSON lines in a .json file
                raise UserError(f"{path}: not valid JSON ({err})") from None
    rows, numbers = [], []
    try:
        for number, _, raw in json_lines(path):
            rows.append(parse_json_line(path, number, raw))
            numbers.append(number)
    except OSError as err:
        raise UserError(f"{path}: cannot read it ({err.strerror or err})") from None
    return (rows, numbers) if line_numbers else rows


JSON_WHITESPACE = b" \t\r\n"


def json_lines(path: str, start: int = 0, stop: int | None = None, first_line: int = 1):
    """(line number, byte offset, raw bytes) of every non-blank line of a JSON-lines file that starts between two
    byte offsets (`stop` None: the end of the file), lines ending at "\n" only. `first_line`: the number of the
    range's first line, for the errors (the lines before it are not read)."""
    with open(path, "rb") as f:
        f.seek(start)
        number, at = first_line, start
        while stop is None or at < stop:
            raw = f.readline()
            if not raw:
                break
            if raw.strip(JSON_WHITESPACE):
                yield number, at, raw
            number, at = number + 1, at + len(raw)


def parse_json_line(path: str, number: int, raw: bytes):
    """One line of `json_lines` as a JSON value; not UTF-8 or not JSON is a one-line UserError naming the line."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: line {number}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{path}: line {number}: not valid JSON ({err.msg}, column {err.colno})") from None


def json_safe(obj):
    """`obj` with every non-finite float (inf, -inf, NaN) as None: what JSON calls null. Python's json would write
    Infinity and NaN, which most JSON readers reject."""
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def json_line(obj) -> str:
    return json.dumps(json_safe(obj), allow_nan=False, ensure_ascii=False)


def write_json_file(path: str, obj) -> None:
    """The one JSON writer: strict JSON (non-finite numbers as null), written atomically (utils.runtime.atomic)."""
    with atomic_file(path) as f:
        json.dump(json_safe(obj), f, indent=1, ensure_ascii=False, allow_nan=False)


def write_json_lines(path: str, rows) -> int:
    """Rows (an iterable of dicts, consumed as a stream: never held together) as JSON lines (`json_line`), written
    atomically (utils.runtime.atomic): an exception while the rows are made leaves `path` as it was. Returns the rows
    written."""
    count = 0
    with atomic_file(path) as f:
        for row in rows:
            f.write(json_line(row) + "\n")
            count += 1
    return count


def write_json(accelerator, path: str, obj) -> None:
    """`write_json_file`, by the main process only (a run's results)."""
    if accelerator.is_main_process:
        write_json_file(path, obj)
