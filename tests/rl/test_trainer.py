"""The RL trainer end to end on a tiny model: the reward rises on a learnable task, and a run killed
with SIGKILL resumes from its last checkpoint and continues exactly as an uninterrupted run."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from rstar2.config import AsyncSection, EngineSection, SchedulerSection
from rstar2.config_files import parse_config, put
from rstar2.rl.run.checkpoint import latest_checkpoint
from rstar2.rl.run.metrics_log import read_metrics
from rstar2.rl.trainer import RLTrainer

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6


# fp32, not `auto`: these runs are compared with each other (one process against torchrun, the
# engine's logprobs against the trainer's, to 1e-4) and teach a 64-wide model in a few steps; under
# the bf16 autocast `auto` picks on an AVX512-BF16 CPU they would depend on the CI machine's CPU.
# tests/test_device.py covers `auto`; the recipe tests run it.
FP32 = {"compute": "fp32"}


# where a rollout setting lives, by its own name: in its section (rollout.engine.servers,
# rollout.scheduler.retries, asynchronous.max_staleness, ...), else right under rollout
HOMES = {
    **{k: f"rollout.engine.{k}" for k in EngineSection.model_fields},
    **{k: f"rollout.scheduler.{k}" for k in SchedulerSection.model_fields},
    **{k: f"asynchronous.{k}" for k in AsyncSection.model_fields},
}


def place(tree: dict, **settings) -> dict:
    """Rollout settings by their own names (``servers=``, ``max_staleness=``), put where they live."""
    for key, value in settings.items():
        put(tree, HOMES.get(key, f"rollout.{key}"), value)
    return tree


def rl_config(model_dir: Path, data: Path, out: Path) -> dict:
    return {
        "kind": "rl",
        "reward": "tests.rl.rewards:first_token_even",
        "model": {"path": str(model_dir), "threads": 1, **FP32},
        "data": {"train": str(data)},
        "rollout": {
            "samples": 8,
            "max_turns": 1,
            "max_response_tokens": 3,
            "top_k": 4,
            "system_prompt": "Answer.",
            "tools_in_prompt": False,  # ~80-token prompts instead of ~650
            "engine": {"max_batch_size": 1},  # one request at a time: the same float path in every run
            "sandbox_workers": 1,
            "verifier_workers": 1,
        },
        "roc": {"keep": 4},
        "optim": {"lr": 1e-2, "warmup_steps": 0, "mini_batches": 2},
        "run": {
            "out": str(out),
            "steps": STEPS,
            "batch_size": 4,
            "save_every": 2,
            "progress": False,
            "kl_to_start": True,  # a frozen copy of the start measures the policy's drift (not in the loss)
        },
    }


@pytest.fixture(scope="module")
def setup(tiny_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("rl")
    rows = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(12)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@pytest.fixture(scope="module")
def uninterrupted(setup, tiny_dir):
    threads = torch.get_num_threads()
    cfg = parse_config(rl_config(tiny_dir, setup / "train.jsonl", setup / "a"))
    try:
        history = asyncio.run(RLTrainer(cfg).train())
    finally:
        torch.set_num_threads(threads)
    return setup / "a", history


@pytest.mark.slow
def test_reward_rises_and_the_run_folder_is_complete(uninterrupted):
    run, history = uninterrupted
    rewards = [m["reward/mean"] for m in history]
    assert len(rewards) == STEPS
    assert sum(rewards[-2:]) / 2 >= rewards[0] + 0.2, rewards
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for key in (
        "accuracy",
        "roc/groups_kept",
        "tools/error_ratio_correct_all",
        "response/length_mean",
        "finish/max_length",
        "tokens_per_s",
        "time/rollout_s",
        "time/update_s",
        "engine/occupancy",
        "engine/join_share",
        "engine/evictions",
    ):
        assert key in rows[0], key
    # the KL to the run's start in every step that updated: never negative (k3), and above 0 once an
    # optimizer step has moved the weights from the start (every step after the first: lr 1e-2)
    kl = [r["update/ref_kl"] for r in rows if "update/skipped" not in r]
    assert kl and kl[0] >= 0 and all(v > 0 for v in kl[1:]), kl
    for r in rows:  # the in-process engine's rows held and time in joins, per step
        assert 0 < r["engine/occupancy"] <= 1 and 0 < r["engine/join_share"] < 1, r
    assert (run / "metrics.png").stat().st_size > 0
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    ckpt = latest_checkpoint(run)
    assert ckpt is not None and ckpt.name == f"step-{STEPS:06d}"
    assert (ckpt / "model.safetensors").is_file() and (ckpt / "trainer_state.pt").is_file()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(ckpt)  # a plain Hugging Face folder
    vocab = len(AutoTokenizer.from_pretrained(ckpt))
    by_class = {k: v for k, v in rows[0].items() if k.startswith("entropy/")}  # entropy per token class
    assert by_class and all(0 <= v <= math.log(vocab) + 1e-4 for v in by_class.values()), by_class
    assert len(list((run / "checkpoints").iterdir())) == 2  # keep_checkpoints
    # samples of every step, with RoC's penalties and choice, for `rstar2 view`
    samples = sorted((run / "samples").glob("step_*.jsonl"))
    assert len(samples) == STEPS
    first = [json.loads(line) for line in samples[0].read_text().splitlines()]
    assert first and all({"kept", "p_err", "p_format"} <= set(d["meta"]["roc"]) for d in first)
    assert any(d["meta"]["roc"]["kept"] for d in first) and all(d["meta"]["step"] == 1 for d in first)


def train_until_killed(config: Path, run: Path) -> None:
    """``rstar2 train CONFIG`` in a subprocess, killed with SIGKILL once step 2's checkpoint is saved."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rstar2", "train", str(config)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and proc.poll() is None:
            if (run / "checkpoints" / "step-000002" / "state.json").exists():
                break
            time.sleep(0.05)
        assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read()[-2000:]}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
@pytest.mark.timeout(900)  # a training subprocess killed and restarted
def test_a_killed_run_resumes_exactly(setup, tiny_dir, uninterrupted):
    run_a, history = uninterrupted
    run_b = setup / "b"
    cfg_path = setup / "b.yaml"
    cfg_path.write_text(yaml.safe_dump(rl_config(tiny_dir, setup / "train.jsonl", run_b)))
    train_until_killed(cfg_path, run_b)
    assert latest_checkpoint(run_b).name in ("step-000002", "step-000004")
    threads = torch.get_num_threads()
    try:
        cfg = parse_config(rl_config(tiny_dir, setup / "train.jsonl", run_b))
        resumed = asyncio.run(RLTrainer(cfg, resume=True).train())
    finally:
        torch.set_num_threads(threads)
    rows_a = read_metrics(run_a / "metrics.jsonl")
    rows_b = read_metrics(run_b / "metrics.jsonl")
    assert [r["step"] for r in rows_b] == list(range(1, STEPS + 1))  # each step once
    assert len(resumed) >= 2
    for a, b in zip(rows_a, rows_b, strict=True):
        assert a.keys() == b.keys(), a["step"]
        for key in ("loss", "grad_norm", "reward/mean", "update/clip_high", "rollouts_kept"):
            if key in a:  # a step whose groups were all dropped has no update metrics
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)
    from safetensors.torch import load_file

    final_a = load_file(str(latest_checkpoint(run_a) / "model.safetensors"))
    final_b = load_file(str(latest_checkpoint(run_b) / "model.safetensors"))
    for k in final_a:
        assert torch.allclose(final_a[k], final_b[k], atol=1e-6), k


@pytest.mark.slow
@pytest.mark.parametrize("staleness", [0, 1])
def test_groups_without_a_reward_spread_are_refilled_from_an_order_of_their_own(
    setup, tiny_dir, tmp_path, staleness
):
    """``roc.refill_groups``: a step whose groups have no reward spread (here: every problem whose
    number is a multiple of 3) samples fresh problems, in an order of their own, until
    ``run.batch_size`` groups have one or the budget is spent; a resumed run continues that order.
    At k = 1 the next step's groups sample meanwhile; the refills follow the same rule."""
    from rstar2.rl.trainer import refill_order

    def run(out: Path, steps: int, resume: bool = False) -> list[dict]:
        tree = rl_config(tiny_dir, setup / "train.jsonl", out)
        tree["reward"] = "tests.rl.rewards:flat_when_a_multiple_of_three"
        tree["roc"]["refill_groups"] = 3
        tree["run"].update(steps=steps, save_every=1)
        if staleness:  # the decoupled correction needs the engine's untruncated distribution
            tree["asynchronous"] = {"max_staleness": staleness}
            tree["loss"] = {"tis_cap": 2.0}
            tree["rollout"]["top_k"] = 0
        threads = torch.get_num_threads()
        try:
            asyncio.run(RLTrainer(parse_config(tree), resume=resume).train())
        finally:
            torch.set_num_threads(threads)
        return read_metrics(out / "metrics.jsonl")

    rows = run(tmp_path / "a", 3)
    cfg = parse_config(yaml.safe_load((tmp_path / "a" / "config.yaml").read_text()))
    refills = refill_order([json.loads(x) for x in (setup / "train.jsonl").read_text().splitlines()], cfg)
    for r in rows:
        step = r["step"]
        samples = [
            json.loads(x)
            for x in (tmp_path / "a" / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()
        ]
        groups: dict[int, list[dict]] = {}
        for t in samples:
            groups.setdefault(t["meta"]["group"], []).append(t)
        n = int(r["groups/refilled"])
        assert sorted(groups) == list(range(4 + n)) and r["roc/groups"] == 4 + n
        spread = [g for g, ts in groups.items() if len({t["reward"] for t in ts}) > 1]
        first = [g for g in spread if g < 4]
        # refilled only while fewer than 4 groups had a spread, and at most 3 a step
        assert n == 0 if len(first) == 4 else (len(spread) >= 4 or n == 3), (step, spread, n)
        # the extra groups' problems are the refill order's next ones
        taken = [row["problem"] for row in refills.take(n)]
        assert [groups[4 + j][0]["problem"] for j in range(n)] == taken
        assert all(int(t["problem"].split()[2]) % 3 for g in spread for t in groups[g][:1])
    assert sum(r["groups/refilled"] for r in rows) > 0
    if staleness:  # a resumed run at k > 0 samples its first step's groups anew, with newer weights
        return
    # two steps, then resumed for the third: the same third step as the run of three
    run(tmp_path / "b", 2)
    again = run(tmp_path / "b", 3, resume=True)
    for key in ("groups/refilled", "reward/mean", "roc/groups_kept", "loss"):
        assert again[-1][key] == pytest.approx(rows[-1][key], rel=1e-5), key
