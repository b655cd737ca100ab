"""``run.keep_steps`` and ``rstar2 replay``: a kept step redone from the checkpoint before it is the
run's bit for bit (k = 0 and k = 1, in-process; the served runs are in test_scale_out.py, the
tiny recipe's RL stages in tests/recipe/test_recipe.py); a changed input is found at its step and
tensor; a what-if changes one setting of one step; what cannot be replayed says what is missing."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from rstar2.cli import app
from rstar2.rl.replay import config_of, replay
from rstar2.rl.run.keep import kept_path, kept_steps, read_kept

from .test_async import _config, _train


def kept_run(tiny_dir, data, name: str, k: int, keep: bool = True) -> Path:
    cfg = _config(tiny_dir, data, name, steps=3, max_staleness=k)
    cfg.run.keep_steps, cfg.run.save_every = keep, 2  # checkpoints after steps 2 and 3
    _train(cfg)
    return Path(cfg.run.out)


@pytest.fixture(scope="module")
def runs(tiny_dir, data) -> dict[int, Path]:
    return {k: kept_run(tiny_dir, data, f"k{k}", k) for k in (0, 1)}


def replay_cli(*args: str):
    threads = torch.get_num_threads()  # a replay takes the run's threads
    try:
        return CliRunner().invoke(app, ["replay", *map(str, args)])
    finally:
        torch.set_num_threads(threads)


def report_of(run: Path, name: str) -> dict:
    return json.loads((run / "replay" / f"{name}.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("k", [0, 1])
def test_every_kept_step_is_redone_bit_for_bit(runs, k):
    run = runs[k]
    assert kept_steps(run) == [1, 2, 3]
    record = read_kept(run, 2)
    n_params = sum(1 for name in record.after if name.startswith("model/"))
    assert n_params > 0 and len(record.after) == 4 * n_params  # weights, exp_avg, exp_avg_sq, step
    assert config_of(record).asynchronous.off_policy is bool(k) and record.threads >= 1

    result = replay_cli(run, "--from", 1, "--to", 3)
    assert result.exit_code == 0, result.output
    report = report_of(run, "from_1_to_3")
    assert report["start"] == "the run's start" and report["first_difference"] is None
    assert [s["step"] for s in report["steps"]] == [1, 2, 3]
    for s in report["steps"]:
        assert len(s["tensors"]) == len(record.after) and all(t["equal"] for t in s["tensors"].values())
        assert {"loss", "grad_norm"} <= set(s["metrics"]) and all(m["equal"] for m in s["metrics"].values())
        assert s["choices_equal"] and s["advantages_equal"]
    assert "bit for bit (3 steps)" in result.output

    # step 3 from the checkpoint after step 2
    result = replay_cli(run, "--step", 3)
    assert result.exit_code == 0, result.output
    assert report_of(run, "step_3")["start"] == "checkpoint step-000002"


@pytest.mark.slow
def test_a_changed_input_is_found_at_its_step_and_tensor(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs[0], run)
    # one kept rollout of step 2 with the other reward: RoC and the advantages change from there on
    path = kept_path(run, 2)
    record = json.loads(gzip.decompress(path.read_bytes()))
    g, i = next((g, c[0]) for g, c in enumerate(record["choices"]) if c)
    trajectory = record["groups"][g][i]
    trajectory["reward"] = 1.0 - trajectory["reward"]
    path.write_bytes(gzip.compress(json.dumps(record).encode()))

    result = replay_cli(run, "--from", 1, "--to", 3)
    assert result.exit_code == 1, result.output
    report = report_of(run, "from_1_to_3")
    assert report["first_difference"] == 2 and [s["step"] for s in report["steps"]] == [1, 2]
    step2 = report["steps"][1]
    assert not step2["advantages_equal"]
    differing = [n for n, t in step2["tensors"].items() if not t["equal"]]
    assert differing and any(n.startswith("model/") for n in differing)
    # the run saved a checkpoint after step 2: how far apart, in its own units
    assert all(step2["tensors"][n]["max_abs"] > 0 for n in differing if n.startswith("model/"))
    assert "Step 2 differs from the run" in result.output and differing[0] in result.output


@pytest.mark.slow
def test_a_tolerance_accepts_other_bits_of_the_same_size(runs, tmp_path):
    """``--rtol`` (for GPU runs): a tensor whose bits differ but whose norm is the run's is close."""
    run = tmp_path / "run"
    shutil.copytree(runs[0], run)
    path = kept_path(run, 1)  # no checkpoint after step 1: the norms are all there is to compare
    record = json.loads(gzip.decompress(path.read_bytes()))
    name = next(iter(record["after"]))
    record["after"][name][0] = "0" * 16  # another digest, the same norm
    path.write_bytes(gzip.compress(json.dumps(record).encode()))
    assert replay_cli(run, "--step", 1).exit_code == 1
    result = replay_cli(run, "--step", 1, "--rtol", "1e-6")
    assert result.exit_code == 0 and "within rtol 1e-06" in result.output, result.output


@pytest.mark.slow
def test_a_what_if_redoes_one_step_with_one_setting_changed(runs):
    run = runs[0]
    # lr 0: the weights cannot move, so every trained token's probability is what it was
    result = replay_cli(run, "--step", 2, "--set", "optim.lr=0")
    assert result.exit_code == 0, result.output
    report = report_of(run, "step_2_optim.lr=0")
    what_if, as_run = report["what_if"]["what-if"], report["what_if"]["as run"]
    assert what_if["ratio/mean"] == what_if["ratio/min"] == what_if["ratio/max"] == 1.0
    assert what_if["ratio/outside_clip"] == 0.0 and as_run["ratio/max"] != 1.0
    assert what_if["lr"] == 0.0 and as_run["lr"] > 0
    assert report["steps"][-1]["step"] == 2 and report["first_difference"] is None  # as run: the run's

    # the run's own value changes nothing: the same numbers on both sides
    lr = read_kept(run, 2).config["optim"]["lr"]
    assert replay_cli(run, "--step", 2, "--set", f"optim.lr={lr}").exit_code == 0
    sides = report_of(run, f"step_2_optim.lr={lr}")["what_if"]
    assert sides["what-if"] == sides["as run"]

    # a setting of another section is what the run sampled with, not the update's
    result = replay_cli(run, "--step", 2, "--set", "rollout.temperature=0.5")
    assert result.exit_code == 2 and "changes the update's settings only" in " ".join(result.output.split())


@pytest.mark.slow
def test_what_cannot_be_replayed_says_what_is_missing(tiny_dir, data, runs, tmp_path):
    plain = kept_run(tiny_dir, data, "not-kept", 0, keep=False)  # the default: nothing kept
    assert not (plain / "kept").exists()
    result = replay_cli(plain, "--step", 1)
    assert result.exit_code == 2 and "run.keep_steps: true" in " ".join(result.output.split())

    run = tmp_path / "run"
    shutil.copytree(runs[0], run)
    kept_path(run, 1).unlink()
    result = replay_cli(run, "--step", 2)  # from the run's start: steps 1 and 2 needed
    assert result.exit_code == 2 and "lacks 1" in " ".join(result.output.split()), result.output
    assert replay_cli(run, "--step", 3).exit_code == 0  # from the checkpoint after step 2
    # the run's start gone (its model moved away): said, by path
    path = kept_path(run, 2)
    record = json.loads(gzip.decompress(path.read_bytes()))
    record["config"]["model"]["path"] = str(tmp_path / "moved-away")
    path.write_bytes(gzip.compress(json.dumps(record).encode()))
    kept_path(run, 1).write_bytes(path.read_bytes())  # any record: only its config is read first
    result = replay_cli(run, "--step", 2)
    assert result.exit_code == 2 and "moved-away, which is not there any more" in " ".join(
        result.output.split()
    )
    with pytest.raises(ValueError, match="give steps from 1 on"):
        replay(run, 3, 2)
    result = replay_cli(run, "--from", 2)
    assert result.exit_code == 2 and "--from A --to B" in result.output
