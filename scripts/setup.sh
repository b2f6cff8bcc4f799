#!/usr/bin/env bash
# Create .venv with the pinned requirements (idempotent; offline-capable once installed), with the pip a new venv
# has, not upgraded: exactly the README's `pip install -r requirements.txt`, so that a pin only a newer pip would
# make up for fails here (CI) first. Then every module the scripts import is imported (benchmarks/preflight.py).
# Debian's tesseract-ocr is installed too (ingest_documents.py --ocr reads scanned PDF pages with it): where apt-get
# is absent or fails, one line says so and set-up goes on (everything else works without it).
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
if ! command -v tesseract >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  if ! { command -v apt-get >/dev/null 2>&1 && $sudo apt-get update -qq &&
         DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq tesseract-ocr >/dev/null; }; then
    echo "setup: Tesseract not installed: OCR of scanned PDFs (ingest_documents.py --ocr) needs apt-get install tesseract-ocr" >&2
  fi
fi
