"""An engine of a user's own, from outside rstar2: ``tests/engines/plugin/`` is a package of its
own, installed here as a user installs theirs, whose ``ToyEngine`` is declared under the
``rstar2.engines`` entry point group. With no change to rstar2 it is connected by its URL, samples
an RL run's rollouts through the real CLI, takes the trainer's weights through ``load_weights``
(an adapter run's base, then its adapters) and passes the trainer's checks (the versions its
tokens carry, what it computes after each load)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rstar2.engines.base import WeightUpdate
from rstar2.engines.hf import HFEngine
from rstar2.rl.run.metrics_log import read_metrics

from ..conftest import ROOT
from ..rl.test_trainer import place, rl_config

PLUGIN = Path(__file__).parent / "plugin"


def install(target: Path) -> Path:
    """The plugin package installed into ``target`` (offline: its build backend is this venv's)."""
    source = shutil.copytree(PLUGIN, target / "src")  # the build writes beside its sources
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*pip, "--target", str(target / "site"), str(source)], check=True, timeout=300)
    return target / "site"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_engine_from_an_installed_package_serves_an_rl_run_with_adapters(tiny_dir, tmp_path):
    site = install(tmp_path / "plugin")
    rows = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(8)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tree = place(
        rl_config(tiny_dir, tmp_path / "train.jsonl", tmp_path / "run"), servers=[f"toy://{tiny_dir}"]
    )
    tree["run"].update(steps=2, save_every=2)
    tree["model"]["lora"] = {"rank": 4, "alpha": 8}
    (tmp_path / "rl.yaml").write_text(yaml.safe_dump(tree))
    loads = tmp_path / "loads.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "src")]),
        "TOY_ENGINE_LOADS": str(loads),
    }
    done = subprocess.run(
        [sys.executable, "-m", "rstar2", "train", str(tmp_path / "rl.yaml")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = [json.loads(x) for x in loads.read_text().splitlines()]
    # the base, then the adapter as version 0 at the run's start; then the adapter alone after each update
    assert [(x["adapter"], x["version"]) for x in seen] == [(False, 0), (True, 0), (True, 1), (True, 2)], seen
    assert Path(seen[0]["folder"]).name == "base"
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in metrics] == [1, 2]
    assert all(r["sync/logprob_diff"] < 1e-4 for r in metrics)  # it samples what the trainer computes
    sampled = [
        json.loads(x)
        for f in (tmp_path / "run" / "samples").glob("*.jsonl")
        for x in f.read_text().splitlines()
    ]
    assert {t["turns"][0]["engine"] for t in sampled} == {f"toy://{tiny_dir}"}


async def test_an_in_process_kind_from_an_installed_package_is_chosen_by_its_name(
    tiny_dir, tmp_path, monkeypatch
):
    from rstar2.config import EngineSection
    from rstar2.engines import kinds

    monkeypatch.syspath_prepend(str(install(tmp_path / "plugin")))
    kinds.installed.cache_clear()
    try:
        (engine,) = await kinds.open_engines(
            EngineSection(kind="toy-local"), model=str(tiny_dir), device="cpu"
        )
        assert type(engine).__name__ == "ToyLocal" and engine.local
        await engine.close()
        with pytest.raises(ValueError, match="no in-process engine kind 'toy'.*known: hf, toy-local"):
            kinds.in_process_kind("toy")  # a served kind is not one
    finally:
        kinds.installed.cache_clear()


async def test_an_engine_refuses_weights_in_a_form_it_does_not_take(tiny):
    """An in-process engine takes tensors, a server a folder: the other form is an error, never a
    version claimed for weights that were not loaded."""
    import copy

    from rstar2.engines.openai import OpenAIEngine
    from rstar2.engines.vllm import VLLMEngine

    local = HFEngine(copy.deepcopy(tiny[0]))
    with pytest.raises(ValueError, match="takes tensors, not a folder"):
        await local.load_weights(WeightUpdate(1, folder=Path("/runs/r/weights")))
    for served in (OpenAIEngine("http://127.0.0.1:9"), VLLMEngine("http://127.0.0.1:9")):
        with pytest.raises(ValueError, match="loads a folder, not tensors"):
            await served.load_weights(WeightUpdate(1, tensors={}))
        await served.close()
    assert local.version == 0
    await local.close()


def test_rstar2_serve_opens_its_engine_through_the_table(tiny_dir):
    """`rstar2 serve --kind` names the in-process kind as `rollout.engine.kind` does: one it does not
    know is said (exit 2), with the kinds it knows."""
    from ..conftest import free_port

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rstar2",
            "serve",
            "--model",
            str(tiny_dir),
            "--port",
            str(free_port()),
            "--kind",
            "nope",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = " ".join(done.stdout.replace("│", " ").split() + done.stderr.replace("│", " ").split())
    assert done.returncode == 2 and "no in-process engine kind 'nope' (known: hf" in said, said[-2000:]
    assert "Traceback" not in said
