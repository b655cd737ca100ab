#!/usr/bin/env bash
# The main job on the embedded default. Until the training recipe lands this is the
# sandbox benchmark's quick mode: isolated Python execution vs. a fresh interpreter per call.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/rstar2" demo "$@"
