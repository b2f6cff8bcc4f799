"""JSON files in and out. Reading: a missing, unreadable or malformed file is a one-line UserError naming the file
(and, for JSON lines, the line). Writing: strict JSON, which most JSON readers require: Python's json would write
Infinity and NaN for numbers that are not finite; they are written as null. Every JSON file of the project is written
by `write_json_file`: to a temporary name, flushed to disk, renamed into place, so that a reader (or a resumed job
after a crash) never sees half a file."""

import json
import math
import os

import numpy as np

from utils.loop.errors import UserError


def read_json(path: str, line_numbers: bool = False):
    """A JSON file, or a list of JSON lines: a *.jsonl file, or a .json file that holds one JSON value per line
    (what datasets' Dataset.to_json writes). A missing, unreadable or malformed file is a UserError that names the
    file and, for JSON lines, the line. With `line_numbers`: (value, the file line of each row of a JSON-lines file,
    None for a JSON document), so that later checks can name the line too."""
    if os.path.isdir(path):
        raise UserError(f"{path}: is a directory, not a file")
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such file")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise UserError(f"{path}: cannot read it ({err.strerror or err})") from None
    if not path.endswith(".jsonl"):
        try:
            return (json.loads(text), None) if line_numbers else json.loads(text)
        except json.JSONDecodeError as err:
            if err.msg != "Extra data":  # "Extra data": more than one value, i.e. JSON lines in a .json file
                raise UserError(f"{path}: not valid JSON ({err})") from None
    rows, numbers = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise UserError(f"{path}: line {number}: not valid JSON ({err.msg}, column {err.colno})") from None
            numbers.append(number)
    return (rows, numbers) if line_numbers else rows


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
    """The one JSON writer: strict JSON (non-finite numbers as null), written to a temporary file, made durable
    (fsync: a manifest or progress record must not vouch for data a power cut loses) and renamed into place."""
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(json_safe(obj), f, indent=1, ensure_ascii=False, allow_nan=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def write_json(accelerator, path: str, obj) -> None:
    """`write_json_file`, by the main process only (a run's results)."""
    if accelerator.is_main_process:
        write_json_file(path, obj)
