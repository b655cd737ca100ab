#!/usr/bin/env bash
# Idempotent: Debian's SLURM (slurm-wlm, 22.05 on bookworm; munge comes as a dependency) for the
# tests that start a private single-host cluster (tests/slurm_cluster.py). Safe to run again.
set -euo pipefail

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v sbatch >/dev/null 2>&1; then
    echo "[setup] installing slurm-wlm (apt-get)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq slurm-wlm >/dev/null
    # Debian enables (and starts, where services may start) munge, slurmctld and slurmd on install;
    # the tests run their own daemons with a private slurm.conf, munge key and socket: stop and
    # disable the system's (systemd, else the init.d scripts).
    for svc in slurmd slurmctld munge; do
        (as_root systemctl disable --now "$svc" >/dev/null 2>&1 \
            || { as_root service "$svc" stop && as_root update-rc.d "$svc" disable; } >/dev/null 2>&1 || true)
    done
fi
