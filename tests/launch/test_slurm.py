"""`rstar2 launch --on slurm`, whole: a real SLURM of two nodes on this host (Debian's slurm-wlm,
started by tests/slurm_cluster.py), the miniature recipe submitted with the cluster's own sbatch,
trained, evaluated, torn down; and the launcher stopped mid-run, which cancels the job."""

from __future__ import annotations

import signal

import pytest

from rstar2.config import ClusterSection
from rstar2.launch.plan import ENGINE, port

from ..slurm_cluster import need_slurm, slurm_cluster
from .conftest import (
    cli_env,
    finished,
    launch,
    launch_recipe,
    launched,
    none_left,
    recipe_finished,
    run_id,
    wait_for,
)


@pytest.fixture
def slurm(tmp_path):
    try:
        need_slurm()
    except FileNotFoundError as exc:
        pytest.fail(f"{exc}: scripts/setup-slurm.sh installs SLURM")  # never skipped: the road is documented
    with slurm_cluster(tmp_path / "slurm", nodes=2) as cluster:
        yield cluster


def with_slurm(cluster) -> dict[str, str]:
    return {**cli_env(), "SLURM_CONF": cluster.env["SLURM_CONF"]}


@pytest.mark.slow
def test_a_recipe_on_slurm_trains_evaluates_and_leaves_nothing(slurm, tmp_path):
    recipe = launch_recipe(tmp_path)
    dry = launch([str(recipe), "--on", "slurm", "--dry-run"], env=with_slurm(slurm))
    code, out = finished(dry, 60)
    script = tmp_path / "run" / "launch" / "launch.sbatch"
    assert code == 0 and str(script) in out, out
    assert "--nodes=2" in script.read_text() and not slurm.processes()  # written, not submitted
    code, out = finished(launch([str(recipe), "--on", "slurm", "--resume"], env=with_slurm(slurm)), 900)
    run = tmp_path / "run"
    logs = "\n".join(f"== {p.name}\n{p.read_text()[-2000:]}" for p in sorted((run / "launch").rglob("*.log")))
    assert code == 0, out[-1500:] + logs
    assert "SLURM job" in out
    cluster = ClusterSection(**__import__("yaml").safe_load(recipe.read_text())["cluster"])
    recipe_finished(run, f"http://127.0.0.1:{port(cluster, 1, ENGINE)}")
    assert {p.name for p in (run / "launch" / "attempt-1").glob("node1-*.log")} == {
        "node1-engine-0.log",
        "node1-worker.log",
    }
    assert not slurm.processes() and not none_left(run_id(run))


def test_the_launcher_stopped_cancels_the_job(slurm, tmp_path):
    recipe = launch_recipe(tmp_path)
    proc = launch([str(recipe), "--on", "slurm"], env=with_slurm(slurm))
    run = tmp_path / "run"
    wait_for(
        lambda: (run / "launch" / "attempt-1" / "node0-trainer.log").exists(), 240, "the trainer started"
    )
    rid = run_id(run)
    assert launched(rid)
    proc.send_signal(signal.SIGTERM)
    code, out = finished(proc, 120)
    assert code == 130, out
    assert not none_left(rid, 60)
    wait_for(lambda: not slurm.processes(), 60, "the job's last processes gone")
