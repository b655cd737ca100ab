#!/bin/bash
# How close a GPU's replay comes to its run: an RL stage on the GPU with every step kept and
# checkpointed, then the whole range replayed (bit for bit or the first difference), each step
# replayed alone from the checkpoint before it (with --rtol, so every step is measured), and a
# what-if. Prints, per step, how many tensors differ and the largest relative difference.
#
#   bash benchmarks/replay_gpu.sh CONFIG OUTDIR [STEPS=6] [COMPUTES="fp32 bf16"]
#
# CONFIG: an RL stage's config.yaml (RESULTS.md used the tiny recipe's rl-64 from its SFT
# checkpoint, model.device: auto). OUTDIR gets tolerance.txt and the runs without checkpoints.
set -u
CONFIG=$1; OUTDIR=$2; STEPS=${3:-6}; COMPUTES=${4:-"fp32 bf16"}
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$OUTDIR"; W=$(mktemp -d)
$PY -c "import torch; print('torch', torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
for c in $COMPUTES; do
  run=$W/$c; t0=$SECONDS
  $PY -m rstar2 train "$CONFIG" --out $run --no-progress --set run.steps=$STEPS --set model.compute=$c \
    --set run.save_every=1 --set run.keep_checkpoints=$((STEPS + 1)) --set run.keep_steps=true \
    > $run.train.log 2>&1; echo "train $c rc=$? $((SECONDS - t0)) s"
  $PY -m rstar2 replay $run --from 1 --to $STEPS > $run.chain.log 2>&1; echo "replay 1..$STEPS $c rc=$?"
  for s in $(seq 1 $STEPS); do
    $PY -m rstar2 replay $run --step $s --rtol 0.05 > $run.step$s.log 2>&1 || echo "replay step $s $c rc=$?"
  done
  $PY -m rstar2 replay $run --step $STEPS --set loss.clip_high=0.2 > $run.whatif.log 2>&1; echo "what-if $c rc=$?"
done
$PY - "$W" <<'PY' | tee "$OUTDIR/tolerance.txt"
import glob, json, os, sys

for run in sorted(glob.glob(sys.argv[1] + "/*/")):
    update = {json.loads(line)["step"]: json.loads(line)["time/update_s"] for line in open(run + "metrics.jsonl")}
    for f in sorted(glob.glob(run + "replay/*.json")):
        r = json.load(open(f))
        for s in r["steps"]:
            t = s["tensors"].values()
            rel = max([v.get("max_rel", 0.0) for v in t] or [0])
            norm = max([abs(v["run_norm"] - (v["replay_norm"] or 0)) / max(abs(v["run_norm"]), 1e-30) for v in t] or [0])
            print(f"{os.path.basename(run[:-1])} {os.path.basename(f)} step {s['step']}: "
                  f"{sum(not v['equal'] for v in t)}/{len(t)} tensors differ, max_rel {rel:.3g}, norm rel {norm:.3g}, "
                  f"choices equal {s['choices_equal']}, advantages equal {s['advantages_equal']}, "
                  f"replay {s['seconds']:.2f} s (update {update[s['step']]:.2f} s), {r['device']}")
PY
tar -C $W --exclude=checkpoints -czf "$OUTDIR/runs.tar.gz" .
rm -rf $W
