#!/usr/bin/env bash
# The whole test suite on a fresh machine: set-up, then pytest. `.ci/run` calls exactly this.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
bash "$ROOT/scripts/setup-vllm.sh"  # the tests that run rstar2 on vLLM
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest "$@"
