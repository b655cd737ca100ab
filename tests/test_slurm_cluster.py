"""The private SLURM cluster (tests/slurm_cluster.py) runs a real two-node batch job on this host."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from .slurm_cluster import need_slurm, slurm_cluster


def test_sbatch_wait_runs_both_ranks_on_two_nodes(tmp_path):
    try:
        need_slurm()
    except FileNotFoundError as e:
        if os.environ.get("CI") == "true" or shutil.which("sbatch"):  # installed (CI does): never a skip
            pytest.fail(str(e))
        pytest.skip(str(e))
    out = tmp_path / "job" / "ranks.out"
    out.parent.mkdir()  # sbatch does not create it: the job would fail with JobLaunchFailure
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --nodes=2 --ntasks-per-node=1\n"
        f"#SBATCH --output={out}\n"
        "srun --kill-on-bad-exit=1 bash -c 'echo rank=$SLURM_PROCID node=$SLURMD_NODENAME'\n"
        "scontrol show hostnames $SLURM_JOB_NODELIST | sed 's/^/host=/'\n"
        "exit 3\n"
    )
    with slurm_cluster(tmp_path / "cluster", nodes=2) as cluster:
        job = subprocess.run(
            ["sbatch", "--wait", str(script)], env=cluster.env, capture_output=True, text=True, timeout=120
        )
        assert job.returncode == 3, job.stderr + cluster.diagnostics()  # the script's own exit code
        lines = sorted(out.read_text().splitlines())
        assert lines == ["host=n1", "host=n2", "rank=0 node=n1", "rank=1 node=n2"], lines
        deadline = time.monotonic() + 10  # slurmstepd may outlive the job's end by a moment
        while cluster.processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cluster.processes() == []
