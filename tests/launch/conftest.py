"""A miniature RL run with a cluster: section, the launcher through the real CLI, and the processes
of a launch found by the run id every one of them carries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rstar2.launch.plan import RUN_ENV

from ..conftest import ROOT
from ..rl.test_trainer import rl_config

_PATH = os.pathsep.join(p for p in (str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH")) if p)
_bands = iter(range(21000, 32000, 320))  # a band a launch (at most 20 nodes), none reused in a session


def band() -> int:
    return next(_bands)


@pytest.fixture(scope="module")
def problems(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("launch-data") / "train.jsonl"
    rows = [{"problem": f"What is {i} * {i + 1}?", "answer": str(i * (i + 1))} for i in range(12)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def launch_config(tiny_dir: Path, problems: Path, folder: Path, steps: int = 2, **cluster) -> Path:
    """An RL config of ``steps`` steps whose cluster: is ``cluster`` (small deadlines, a fresh band)."""
    tree = rl_config(tiny_dir, problems, folder / "run")
    tree["run"].update(steps=steps, save_every=1, samples_per_step=8)
    tree["cluster"] = {
        "nodes": 2,
        "engine_nodes": 1,
        "sandbox_workers_per_node": 1,
        "port_base": band(),
        "start_timeout_s": 60,
        "grace_s": 5,
        **cluster,
    }
    path = folder / "rl.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def cli_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": _PATH}


def launch(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """``rstar2 launch ARGS`` in its own process, its output captured."""
    cmd = [sys.executable, "-m", "rstar2", "launch", *args]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env or cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finished(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def run_id(run: Path) -> str:
    return json.loads(sorted((run / "launch").glob("attempt-*/plan.json"))[-1].read_text())["run_id"]


def launched(rid: str) -> list[int]:
    """The live processes of launch ``rid``: every one carries ``RSTAR2_LAUNCH_RUN=rid``."""
    found = []
    mark = f"{RUN_ENV}={rid}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if mark in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def none_left(rid: str, timeout: float = 30) -> list[int]:
    end = time.monotonic() + timeout
    while (left := launched(rid)) and time.monotonic() < end:
        time.sleep(0.5)
    return left


def wait_for(check, timeout: float, what: str):
    end = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > end:
            raise AssertionError(f"{what} within {timeout} s")
        time.sleep(0.2)
    return found


def launch_recipe(folder: Path, **cluster) -> Path:
    """The miniature recipe (SFT, then one RL stage, evaluations between) with a cluster: section."""
    from ..recipe.test_recipe import miniature

    tree = miniature()
    tree["stages"] = tree["stages"][:2]
    tree["eval"]["entropy_trajectories"] = 0
    tree["cluster"] = {
        "nodes": 2,
        "engine_nodes": 1,
        "sandbox_workers_per_node": 1,
        "port_base": band(),
        "start_timeout_s": 120,
        "grace_s": 5,
        "run_dir": str(folder / "run"),
        **cluster,
    }
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def recipe_finished(run: Path, engine: str) -> None:
    """Every stage trained and evaluated, every sample drawn from ``engine``."""
    state = json.loads((run / "recipe_state.json").read_text())
    assert list(state["evals"]) == ["start", "sft", "rl-64"]
    assert (run / "report.md").exists()
    sampled = [json.loads(x) for f in run.glob("*/**/trajectories.jsonl") for x in f.read_text().splitlines()]
    assert sampled and {t["turns"][0]["engine"] for t in sampled} == {engine}
