#!/usr/bin/env bash
# The main job on the embedded default: the tiny recipe (recipes/tiny.yaml) on CPU -- a tokenizer
# and a small Qwen2 model built here, non-reasoning SFT, three RL stages, held-out evals, a report.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/rstar2" demo "$@"
