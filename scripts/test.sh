#!/usr/bin/env bash
# The whole test suite on a fresh machine: set-up, then pytest. `.ci/run` calls exactly this.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
bash "$ROOT/scripts/setup-vllm.sh"  # the tests that run rstar2 on vLLM
bash "$ROOT/scripts/setup-slurm.sh"  # the tests that launch on a real (single-host) SLURM
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest "$@"
