"""Tool-use health in real RL runs on the tiny model: the figures reach metrics.jsonl and
TensorBoard, warnings reach the log and health.jsonl (and survive a resume), and a run asked to
stop on them stops through the CLI with a clear message and a checkpoint.

The tiny model writes three tokens and never a tool call, so every rollout shows ``no_call``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess

import pytest
import torch
import yaml

from rstar2.config_files import parse_config
from rstar2.rl.run.checkpoint import latest_checkpoint
from rstar2.rl.run.metrics_log import read_metrics
from rstar2.rl.trainer import RLTrainer
from rstar2.rollout.health import read_warnings

from ..conftest import RSTAR2
from .test_trainer import rl_config


def tree(tiny_dir, tmp_path, steps: int, **health) -> dict:
    rows = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(4)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    t = rl_config(tiny_dir, tmp_path / "train.jsonl", tmp_path / "run")
    t["rollout"]["samples"] = 4
    t["roc"]["keep"] = 2
    t["run"].update(steps=steps, batch_size=2, save_every=2, health=health)
    return t


def train(t: dict, resume: bool = False) -> list[dict]:
    threads = torch.get_num_threads()
    try:
        return asyncio.run(RLTrainer(parse_config(t), resume=resume).train())
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_health_reaches_metrics_tensorboard_and_warnings_and_survives_a_resume(tiny_dir, tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    t = tree(tiny_dir, tmp_path, 3, unparseable=None)
    train(t)
    run = tmp_path / "run"
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["health/no_call"] for r in rows] == [1.0, 1.0, 1.0]
    assert all(r["health/unparseable"] == r["health/repeated"] == r["health/output_cut"] == 0.0 for r in rows)
    assert [r["health/warnings"] for r in rows] == [1.0, 1.0, 1.0]
    said = read_warnings(run)
    assert [(w["step"], w["sign"], w["steps_over"]) for w in said] == [(s, "no_call", s) for s in (1, 2, 3)]
    err = capsys.readouterr().err
    assert "[rstar2] warning: tool-use health, step 3: 100% of rollouts show no tool call" in err
    tb = EventAccumulator(str(run / "tensorboard"))
    tb.Reload()
    assert [e.value for e in tb.Scalars("health/no_call")] == [1.0, 1.0, 1.0]
    # resumed from step 2's checkpoint: step 3 is redone, and its count goes on from step 2's
    t["run"]["steps"] = 4
    train(t, resume=True)
    said = read_warnings(run)
    assert [(w["step"], w["steps_over"]) for w in said] == [(1, 1), (2, 2), (3, 3), (4, 4)]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_run_asked_to_stop_on_health_stops_through_the_cli_saying_why(tiny_dir, tmp_path):
    t = tree(tiny_dir, tmp_path, 5, no_call=0.5, stop=True, patience=2)
    (tmp_path / "rl.yaml").write_text(yaml.safe_dump(t))
    wide = {**os.environ, "COLUMNS": "400"}
    r = subprocess.run(
        [*RSTAR2, "train", str(tmp_path / "rl.yaml"), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=500,
        env=wide,
    )
    assert r.returncode != 0
    assert "RL step 2: stopped by run.health: no tool call in 100% of rollouts" in r.stderr, r.stderr
    assert "run.health.no_call = 0.5 for 2 steps in a row" in r.stderr
    assert "warning: tool-use health, step 1" in r.stderr
    assert "it/s]" not in r.stderr  # --no-progress: no library's bar either (transformers' shard writing)
    run = tmp_path / "run"
    assert latest_checkpoint(run).name == "step-000002"  # saved before stopping
    assert len(read_metrics(run / "metrics.jsonl")) == 2
    assert "stopped by run.health" in (run / "error.txt").read_text()
