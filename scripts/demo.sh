#!/usr/bin/env bash
# The README's main-job command: set up .venv, then train the reader on the shipped sample, offline.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
exec .venv/bin/python train_reader.py "$@"
