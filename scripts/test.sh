#!/usr/bin/env bash
# The README's test command: set up .venv (and Debian's Chromium for the server's browser test: Playwright's own
# browser download is not reachable; and PostgreSQL, whose throwaway servers test the feedback store), then run the
# whole suite, two test files at a time, one torch thread each (most of a test is a subprocess's Python start-up,
# which one core runs; two workers with two OpenMP threads each on two cores leave threads spinning for a core, and
# the kill-and-resume runs took several times as long).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
missing=""
command -v chromium >/dev/null 2>&1 || missing="chromium"
command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 ||
  missing="$missing postgresql"
if [ -n "$missing" ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile tests "$@"
