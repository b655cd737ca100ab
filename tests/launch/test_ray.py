"""`rstar2 launch --on ray`, whole: a real Ray cluster of three nodes on loopback, each with a
logical GPU (tests/ray_cluster.py). The miniature recipe: the trainer on one node, an engine on each
of the others, a sandbox worker on every node, placed by a STRICT_SPREAD placement group; an engine
node lost mid-run; a cluster too small for the run, said at its deadline."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from rstar2.config import ClusterSection
from rstar2.launch.plan import ENGINE, port

from .conftest import cli_env, finished, launch, launch_recipe, none_left, run_id, wait_for

pytestmark = pytest.mark.slow
NODES = [{"num_cpus": 2, "num_gpus": 1}] * 3


@pytest.fixture
def ray(tmp_path):
    try:
        import ray  # noqa: F401
    except ImportError as exc:  # never skipped: the road is documented (pip install 'rstar2[ray]')
        pytest.fail(f"ray is not installed ({exc}): scripts/setup.sh installs rstar2[dev]")
    from ..ray_cluster import ray_cluster

    with ray_cluster(tmp_path / "ray", NODES) as cluster:
        yield cluster


def on_ray(cluster) -> dict[str, str]:
    return {**cli_env(), **cluster.env}


def ray_node_of(cluster, rank: int) -> int:
    """The index of the Ray node whose processes include launch-node --rank RANK."""
    pid = int(subprocess.check_output(["pgrep", "-f", f"launch-node --rank {rank}"], text=True).split()[0])
    return next(i for i in range(len(NODES)) if pid in cluster.pids(i))


def test_a_recipe_on_ray_one_engine_node_lost(ray, tmp_path):
    """An engine node is killed whole once the run has sampled: the run goes on on the other one.

    The engine node killed is one Ray did not place on its head node: losing the head (its GCS) is
    losing the Ray cluster itself, and the launcher's Ray driver with it."""
    recipe = launch_recipe(
        tmp_path, nodes=3, engine_nodes=2, gpus_per_node=1, engine_args=["--device", "cpu"]
    )
    proc = launch([str(recipe), "--on", "ray", "--address", ray.address], env=on_ray(ray))
    run = tmp_path / "run"
    wait_for(lambda: any(run.glob("*/**/trajectories.jsonl")), 300, "the first evaluation")
    ray_node = {rank: ray_node_of(ray, rank) for rank in (1, 2)}  # the Ray node each engine rank is on
    lost = next(rank for rank in (2, 1) if ray_node[rank] != 0)  # at most one rank is on the head
    kept = 3 - lost
    ray.kill_node(ray_node[lost])
    code, out = finished(proc, 900)
    logs = "\n".join(f"== {p.name}\n{p.read_text()[-1500:]}" for p in sorted((run / "launch").rglob("*.log")))
    assert code == 0, out[-2000:] + logs
    assert "placed by Ray" in out and f"node {lost} (engine) was lost" in out, out
    cluster = ClusterSection(**yaml.safe_load(recipe.read_text())["cluster"])
    state = (run / "recipe_state.json").read_text()
    assert '"rl-64"' in state and (run / "report.md").exists()
    after = [p for p in run.glob("02-*/samples/*.jsonl")]  # the RL stage ran after the loss
    engines = {
        __import__("json").loads(x)["turns"][0]["engine"] for p in after for x in p.read_text().splitlines()
    }
    assert engines == {f"http://127.0.0.1:{port(cluster, kept, ENGINE)}"}, engines
    assert not none_left(run_id(run))


def test_a_cluster_too_small_is_said_at_the_deadline(ray, tmp_path):
    recipe = launch_recipe(tmp_path, nodes=4, engine_nodes=3, gpus_per_node=1, start_timeout_s=5)
    code, out = finished(launch([str(recipe), "--on", "ray", "--address", ray.address], env=on_ray(ray)), 120)
    assert code == 1, out
    assert "Ray did not place 4 nodes within 5 s" in out and "has 3 alive nodes" in out, out
    assert not any((tmp_path / "run" / "launch").rglob("node*.log"))  # no node started
