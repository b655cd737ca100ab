#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian machine: system packages, a virtual environment, the package.
# Sourced by scripts/demo.sh and scripts/test.sh; safe to run again.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RSTAR2_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# redis-server (distributed sandbox mode and its tests) from Debian's packages.
if ! command -v redis-server >/dev/null 2>&1; then
    echo "[setup] installing redis-server (apt-get)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq redis-server >/dev/null
    # Debian starts a system service on install; rstar2 runs its own servers.
    (as_root systemctl disable --now redis-server >/dev/null 2>&1 || true)
fi

# chromium (Debian's): the viewer's tests open its page in a real headless browser (Playwright
# drives this one; it downloads none of its own).
if ! command -v chromium >/dev/null 2>&1; then
    echo "[setup] installing chromium (apt-get)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating virtual environment $VENV"
    "$PY" -m venv "$VENV"
fi
stamp="$VENV/.rstar2-installed"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
    echo "[setup] installing rstar2 and its dependencies"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    # CPU PyTorch first, so the package's own torch requirement is already met by it.
    "$VENV/bin/python" -m pip install -q "torch==${RSTAR2_TORCH_VERSION:-2.13.0}"
    "$VENV/bin/python" -m pip install -q -e "$ROOT[dev]"
    touch "$stamp"
fi
