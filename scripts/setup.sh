#!/usr/bin/env bash
# Create .venv with the pinned requirements (idempotent; offline-capable once installed), with the pip a new venv
# has, not upgraded: exactly the README's `pip install -r requirements.txt`, so that a pin only a newer pip would
# make up for fails here (CI) first. Then every module the scripts import is imported (benchmarks/preflight.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.requirements.sha256
want=$(sha256sum requirements.txt | cut -c1-64)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install --quiet -r requirements.txt
  .venv/bin/python benchmarks/preflight.py >/dev/null
  echo "$want" > "$stamp"
fi
