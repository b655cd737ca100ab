"""What a launch runs where: the run (a config or a recipe, validated where it was launched), its
cluster, each node's kind and ports, and the run's settings wired to the cluster's addresses. Pure:
the same plan and node addresses give every node the same answers, so no node asks another."""

from __future__ import annotations

import functools
import json
import os
import secrets
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from ..config import PORTS_PER_NODE, ClusterSection

REDIS, SANDBOX, WEIGHTS, RENDEZVOUS, ENGINE = 0, 1, 2, 3, 8  # a port's offset in its node's share
PLAN_ENV = "RSTAR2_LAUNCH_PLAN"  # the plan's JSON, where no file reaches every node (SLURM's script)
RUN_ENV = "RSTAR2_LAUNCH_RUN"  # every process of a launch carries its run id: found, and stopped, by it


@dataclass
class Plan:
    run_id: str
    run_dir: str  # absolute
    cwd: str  # where the config's relative paths are read from
    kind: Literal["config", "recipe"]
    tree: dict[str, Any]  # the validated config or recipe, every default written out
    python: str  # the Python every node runs rstar2 with

    @functools.cached_property
    def cluster(self) -> ClusterSection:
        return ClusterSection.model_validate(self.tree.get("cluster") or {})

    @property
    def name(self) -> str:
        return self.tree.get("name") or Path(self.run_dir).name

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls(**json.loads(text))


def new_plan(source: Path, overrides: list[str]) -> Plan:
    """The plan of ``source`` (a config or a recipe file) with ``--set`` overrides, checked here:
    a broken config fails before any node starts."""
    from ..config_files import load_config, read_yaml

    tree = read_yaml(source, "config", overrides)
    if "stages" in tree:
        from ..recipe.spec import load_recipe

        recipe = load_recipe(source, overrides)
        if recipe.vllm is not None:
            raise ValueError("a launched recipe samples on its cluster's engines: leave vllm: out")
        run: Any = recipe
        kind, default_dir = "recipe", f"runs/{recipe.name}"
    else:
        run = load_config(source, overrides)
        kind, default_dir = "config", run.run.out
    cluster = run.cluster or ClusterSection()
    if kind == "recipe" and cluster.trainer_nodes > 1:
        raise ValueError(
            f"a recipe trains in one process, on the head: cluster.nodes ({cluster.nodes}) - engine_nodes "
            f"({cluster.engine_nodes}) must be 1 (a stage's config.yaml launched alone trains on several)"
        )
    if not cluster.shared_fs and cluster.trainer_nodes > 1:
        raise ValueError(
            "cluster.shared_fs: false sends weights to engines over HTTP, but the trainer's processes on "
            f"{cluster.trainer_nodes} nodes share one run folder (its checkpoints): give them a shared one, "
            "or train on one node (nodes - engine_nodes = 1)"
        )
    if cluster.engine_nodes and (kind == "config" and run.kind == "sft"):
        raise ValueError("an SFT config samples nothing: cluster.engine_nodes must be 0")
    run_dir = Path(cluster.run_dir or default_dir).expanduser().resolve()
    tree = run.model_dump(mode="json")
    tree["cluster"] = {**cluster.model_dump(mode="json"), "run_dir": str(run_dir)}
    return Plan(secrets.token_hex(6), str(run_dir), str(Path.cwd()), kind, tree, sys.executable)


# -- nodes ----------------------------------------------------------------------------------------
def port(cluster: ClusterSection, rank: int, offset: int) -> int:
    """A port of node ``rank``'s share of the band (each node its own, so nodes may share a host)."""
    return cluster.port_base + PORTS_PER_NODE * rank + offset


def node_kind(cluster: ClusterSection, rank: int) -> Literal["head", "trainer", "engine"]:
    """Node 0 is the head (services and the first trainer process); then trainer nodes; engine nodes last."""
    return "head" if rank == 0 else "trainer" if rank < cluster.trainer_nodes else "engine"


def engines_on(cluster: ClusterSection) -> int:
    """Engines an engine node serves: one a GPU, one on a CPU node."""
    return max(1, cluster.gpus_per_node)


def engine_urls(cluster: ClusterSection, hosts: list[str]) -> list[str]:
    return [
        f"http://{hosts[r]}:{port(cluster, r, ENGINE + g)}"
        for r in range(cluster.trainer_nodes, cluster.nodes)
        for g in range(engines_on(cluster))
    ]


def redis_url(cluster: ClusterSection, hosts: list[str]) -> str:
    """The head's Redis (its password travels as ``$RSTAR2_REDIS_PASSWORD``, never in the URL)."""
    return f"redis://{hosts[0]}:{port(cluster, 0, REDIS)}/0"


def service_url(cluster: ClusterSection, hosts: list[str], offset: int) -> str:
    return f"http://{hosts[0]}:{port(cluster, 0, offset)}"


def run_tree(plan: Plan, hosts: list[str]) -> dict[str, Any]:
    """The run's config (or recipe) as the trainer reads it: the engines, the sandbox service and
    (without a shared filesystem) the trainer's weight service wired in; a config's run folder."""
    tree = json.loads(json.dumps(plan.tree))
    cluster = plan.cluster
    if plan.kind == "config":
        tree["run"]["out"] = plan.run_dir
        if tree["kind"] == "sft":
            return tree
    rollout = tree.setdefault("rollout", {})
    engine = rollout.setdefault("engine", {})
    rollout["sandbox"] = service_url(cluster, hosts, SANDBOX)
    if cluster.engine_nodes:  # else: the run's own servers, or the trainer samples itself
        engine["servers"] = engine_urls(cluster, hosts)
        if not cluster.shared_fs:
            engine["weights_url"] = service_url(cluster, hosts, WEIGHTS)
    return tree


def lora_rank(plan: Plan) -> int | None:
    """The largest adapter rank the run trains (its engines must hold adapters that large)."""
    if plan.kind == "recipe":
        from ..recipe.run import adapter_rank
        from ..recipe.spec import parse_recipe

        return adapter_rank(parse_recipe(plan.tree, check_paths=False))
    lora = plan.tree["model"].get("lora")
    return lora["rank"] if lora else None


def visible_gpus() -> list[str]:
    """This machine's GPUs as ``CUDA_VISIBLE_DEVICES`` names them (every one where it is unset)."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [g for g in given.split(",") if g]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]
