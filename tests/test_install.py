"""Installed, not only checked out: the package built as a wheel, installed into a fresh virtual
environment, runs the demo from another directory (recipes and data ship inside the package)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig

import pytest

from .conftest import ROOT


def miniature_sets() -> list[str]:
    """`--set` values that shrink the tiny recipe to seconds (the shape of tests/recipe's miniature)."""
    sets = ["model.vocab=320", "model.hidden=32", "model.layers=1", "model.heads=2", "model.mlp=64"]
    sets += ["eval.count=3", "eval.samples=1", "eval.entropy_trajectories=4", "defaults.sft.run.batch_size=8"]
    sets += ["rollout.samples=4", "rollout.max_turns=2", "defaults.rl.roc.keep=2"]
    sets += ["defaults.rl.run.batch_size=2", "stages.sft.run.steps=2", "stages.sft.sft.stop_loss=null"]
    sets += ["stages.sft.data.generator.count=16"]
    for stage in ("rl-64", "rl-128", "rl-hard"):
        sets += [f"stages.{stage}.run.steps=1", f"stages.{stage}.rollout.max_response_tokens=40"]
        sets += [f"stages.{stage}.data.generator.count=3"]
        sets += [f"stages.{stage}.filter={{samples: 2, min_solved: 0, max_solved: 2}}"]
    return [x for s in sets for x in ("--set", s)]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_installed_package_runs_the_demo_from_another_directory(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    wheels = tmp_path / "wheels"
    build = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(wheels),
    ]
    subprocess.run([*build, str(ROOT)], check=True, env=env, timeout=600, capture_output=True)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    site = next((venv / "lib").glob("python*/site-packages"))
    # the dependencies (torch, transformers, ...) from this environment, but not its editable rstar2:
    # a path line in a .pth adds a directory without running that directory's own .pth files
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel = next(wheels.glob("rstar2-*.whl"))
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)]
    subprocess.run(pip, check=True, env=env, timeout=600, capture_output=True)

    work = tmp_path / "elsewhere"
    work.mkdir()
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import rstar2; print(rstar2.__file__)"],
        cwd=work, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert where.stdout.strip().startswith(str(site)), where.stdout  # the installed copy, not the checkout
    run = subprocess.run(
        [str(venv / "bin" / "rstar2"), "demo", "--out", "run", "--no-progress", *miniature_sets()],
        cwd=work, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert (work / "run" / "report.md").is_file() and (
        work / "run" / "04-rl-hard" / "metrics.jsonl"
    ).is_file()
    assert "held-out accuracy" in run.stdout + run.stderr
    assert "it/s]" not in run.stderr  # --no-progress: no library's bar either
