#!/bin/bash
# rstar2 launch: run r1 (config: x), written by `rstar2 launch --on slurm`.
# Edit it freely and submit it again with `sbatch`: it needs $RSTAR2_API_KEY and $RSTAR2_REDIS_PASSWORD
# in the submitting environment (sbatch exports them to the job; they are in no file and no log).
#   node 0: head
#   node 1: engine, engines on ports 20024+
#SBATCH --job-name=rstar2-x
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --output=/runs/x/launch/slurm-%j.out
#SBATCH --requeue
#SBATCH --no-kill
set -euo pipefail
: "${RSTAR2_API_KEY:?set it (and RSTAR2_REDIS_PASSWORD) in the submitting environment: a fresh secret each}"
: "${RSTAR2_REDIS_PASSWORD:?set it in the submitting environment: a fresh secret}"
cd /work 2>/dev/null || cd /tmp  # where the run's relative paths are read, where a node has it
export RSTAR2_LAUNCH_RUN=r1
# a requeued job is the next attempt: every node resumes from the run's last checkpoint
ATTEMPT=$(( 1 + ${SLURM_RESTART_COUNT:-0} ))
# each node's address as SLURM knows it (NodeAddr, else its name), in the order of SLURM_PROCID
HOSTS=$(for name in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
    scontrol show node "$name" -o | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p'
done | paste -sd, -)
# the plan: the config as validated where it was launched, and its cluster
export RSTAR2_LAUNCH_PLAN=$(cat <<'PLAN'
{
 "run_id": "r1",
 "run_dir": "/runs/x",
 "cwd": "/work",
 "kind": "config",
 "tree": {
  "kind": "rl",
  "model": {
   "path": "/m",
   "lora": null
  },
  "run": {
   "out": "runs/rl"
  },
  "rollout": {},
  "cluster": {
   "nodes": 2,
   "engine_nodes": 1,
   "engine": "serve",
   "engine_args": [],
   "gpus_per_node": 0,
   "sandbox_workers_per_node": 0,
   "port_base": 20000,
   "run_dir": null,
   "shared_fs": true,
   "start_timeout_s": 300.0,
   "grace_s": 60.0,
   "engine_restarts": 3,
   "slurm": {
    "partition": null,
    "account": null,
    "time": null,
    "sbatch": [],
    "setup": []
   }
  }
 },
 "python": "/venv/bin/python"
}
PLAN
)
export HOSTS ATTEMPT LOGS=/runs/x/launch/attempt-$ATTEMPT
srun --ntasks-per-node=1 mkdir -p "$LOGS"
# a task a node, its rank SLURM_PROCID after the step's first node. The trainer's nodes: any that
# fails ends the step, and the step's end ends the job. The engine nodes: one lost is left out of
# rotation by the trainer, the others serve on. SIGTERM (scancel, the launcher) reaches every node,
# which gives its roles 60 s (a checkpoint in flight) before SIGKILL.
srun --nodes=1 --ntasks=1 --relative=0 --kill-on-bad-exit=1 \
    bash -c 'RANK=$SLURM_PROCID; exec /venv/bin/python -m rstar2 launch-node --rank $RANK --hosts "$HOSTS" --attempt "$ATTEMPT" > "$LOGS/node$RANK.log" 2>&1' &
TRAINERS=$!
srun --nodes=1 --ntasks=1 --relative=1 \
    bash -c 'RANK=$(( 1 + SLURM_PROCID )); exec /venv/bin/python -m rstar2 launch-node --rank $RANK --hosts "$HOSTS" --attempt "$ATTEMPT" > "$LOGS/node$RANK.log" 2>&1' &
ENGINES=$!
trap 'kill -TERM $TRAINERS $ENGINES 2>/dev/null; wait' TERM INT
status=0
wait $TRAINERS || status=$?
if [ -n "$ENGINES" ]; then  # the run is over: the engines too (they may have left already)
    kill -TERM $ENGINES 2>/dev/null || true
    wait $ENGINES || true
fi
exit $status
