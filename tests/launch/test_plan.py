"""The plan, by hand: which node is what, its ports, the run's settings wired to the nodes'
addresses, the cluster's bounds; and the sbatch script as golden files for 1, 2 and 4 nodes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from rstar2.config import ClusterSection
from rstar2.launch import plan as P
from rstar2.launch.roads import sbatch_script

GOLDEN = Path(__file__).with_name("golden")


def plan_of(tree: dict, **cluster) -> P.Plan:
    tree = {**tree, "cluster": ClusterSection(**cluster).model_dump(mode="json")}
    return P.Plan("r1", "/runs/x", "/work", "config", tree, "/venv/bin/python")


RL = {"kind": "rl", "model": {"path": "/m", "lora": None}, "run": {"out": "runs/rl"}, "rollout": {}}


def test_nodes_ports_and_urls_by_hand():
    c = ClusterSection(nodes=4, engine_nodes=2, gpus_per_node=2, port_base=20000)
    assert [P.node_kind(c, r) for r in range(4)] == ["head", "trainer", "engine", "engine"]
    assert P.port(c, 0, P.REDIS) == 20000 and P.port(c, 0, P.SANDBOX) == 20001
    assert P.port(c, 2, P.ENGINE + 1) == 20000 + 2 * 16 + 9
    hosts = ["h0", "h1", "h2", "h3"]
    assert P.engine_urls(c, hosts) == [
        "http://h2:20040",
        "http://h2:20041",
        "http://h3:20056",
        "http://h3:20057",
    ]
    assert P.redis_url(c, hosts) == "redis://h0:20000/0"  # the password is never in it


def test_the_run_is_wired_to_the_cluster():
    shared = P.run_tree(plan_of(RL, nodes=2, engine_nodes=1, port_base=30000), ["a", "b"])
    assert shared["run"]["out"] == "/runs/x"
    assert shared["rollout"]["engine"]["servers"] == ["http://b:30024"]
    assert shared["rollout"]["sandbox"] == "http://a:30001"
    assert "weights_url" not in shared["rollout"]["engine"]
    apart = P.run_tree(plan_of(RL, nodes=2, engine_nodes=1, port_base=30000, shared_fs=False), ["a", "b"])
    assert apart["rollout"]["engine"]["weights_url"] == "http://a:30002"
    alone = P.run_tree(plan_of(RL, nodes=2), ["a", "b"])
    assert "servers" not in alone["rollout"]["engine"]  # no engine node: the trainer samples itself
    own = {**RL, "rollout": {"engine": {"servers": ["http://mine:8000"]}}}
    assert P.run_tree(plan_of(own, nodes=2), ["a", "b"])["rollout"]["engine"]["servers"] == [
        "http://mine:8000"
    ]


@pytest.mark.parametrize(
    "cluster, words",
    [
        ({"nodes": 2, "engine_nodes": 2}, "must leave a node to train"),
        ({"nodes": 1, "engine_nodes": 1}, "must leave a node to train"),
        ({"nodes": 20, "port_base": 32600}, "into the ephemeral range"),
        ({"port_base": 80}, "greater than or equal to 1024"),
        ({"nodes": 0}, "greater than or equal to 1"),
        ({"gpus_per_node": 9}, "less than or equal to 8"),
    ],
)
def test_a_cluster_out_of_bounds_is_refused_naming_why(cluster, words):
    with pytest.raises(ValueError, match=words):
        ClusterSection(**cluster)


@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_the_sbatch_script_is_the_golden_one(nodes):
    """A change to the script is a change to these files: read the diff (REGOLD=1 writes them)."""
    cluster = {"nodes": nodes, "engine_nodes": nodes // 2, "gpus_per_node": 0 if nodes < 4 else 8}
    cluster["slurm"] = (
        {"partition": "gpu", "time": "24:00:00", "setup": ["source /venv/bin/activate"]} if nodes == 4 else {}
    )
    script = sbatch_script(plan_of(RL, **cluster), attempt=1)
    golden = GOLDEN / f"sbatch-{nodes}.sh"
    if os.environ.get("REGOLD"):
        golden.write_text(script)
    assert script == golden.read_text()
    assert "RSTAR2_API_KEY=" not in script and "REDIS_PASSWORD=" not in script


def test_a_recipe_and_a_config_make_plans(tmp_path, tiny_dir):
    recipe = Path(__file__).resolve().parents[2] / "src" / "rstar2" / "recipes" / "tiny.yaml"
    plan = P.new_plan(recipe, ["cluster.nodes=2", "cluster.engine_nodes=1", f"cluster.run_dir={tmp_path}/r"])
    assert plan.kind == "recipe" and plan.run_dir == str(tmp_path / "r")
    wired = P.run_tree(plan, ["127.0.0.1"] * 2)
    assert wired["rollout"]["engine"]["servers"] == ["http://127.0.0.1:20024"]
    with pytest.raises(ValueError, match="share one run folder"):
        P.new_plan(
            config_file(tmp_path, tiny_dir),
            ["cluster.nodes=3", "cluster.engine_nodes=1", "cluster.shared_fs=false"],
        )
    with pytest.raises(ValueError, match="a recipe trains in one process"):
        P.new_plan(recipe, ["cluster.nodes=3", "cluster.engine_nodes=1"])
    config = tmp_path / "sft.yaml"
    config.write_text(
        yaml.safe_dump({"kind": "sft", "model": {"path": str(tiny_dir)}, "data": {"train": "x.jsonl"}})
    )
    with pytest.raises(ValueError, match="engine_nodes must be 0"):
        P.new_plan(config, ["cluster.nodes=2", "cluster.engine_nodes=1"])


def config_file(folder: Path, model: Path) -> Path:
    (folder / "train.jsonl").write_text('{"problem": "1+1?", "answer": "2"}\n')
    path = folder / "rl.yaml"
    path.write_text(
        yaml.safe_dump(
            {"kind": "rl", "model": {"path": str(model)}, "data": {"train": str(folder / "train.jsonl")}}
        )
    )
    return path


def test_the_command_says_what_is_wrong_before_anything_starts(tmp_path, tiny_dir):
    from typer.testing import CliRunner

    from rstar2.cli import app

    def said(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(app, ["launch", *args])
        return result.exit_code, " ".join(result.output.split())

    code, out = said("--recipe", "nosuch", "--on", "local")
    assert code == 2 and "no recipe 'nosuch'" in out
    config = config_file(tmp_path, tiny_dir)
    code, out = said(str(config), "--on", "ray")
    assert code == 2 and "--on ray needs the cluster's address" in out
    code, out = said(str(config), "--on", "local", "--set", "cluster.engine_nodes=1")
    assert code == 2 and "must leave a node to train" in out
    code, out = said(
        str(config), "--on", "slurm", "--dry-run", "--set", f"cluster.run_dir={tmp_path / 'run'}"
    )
    assert code == 0 and (tmp_path / "run" / "launch" / "launch.sbatch").is_file()
