"""The policy never learns from the system's faults: rollouts spoiled by the code environment, the
engine or the verifier are counted under faults/* and left out of RoC and the update, and a step
where they are too many stops with what went wrong."""

from __future__ import annotations

import json
import re

import pytest
import torch

from rstar2.config_files import parse_config
from rstar2.rl.run.launch import RunError
from rstar2.rl.run.metrics_log import read_metrics
from rstar2.rl.run.step_metrics import step_metrics
from rstar2.rl.trainer import RLTrainer
from rstar2.sandbox.result import ExecResult

from .test_trainer import rl_config


class FlakyEnvironment:
    """The code environment failing every ``every``-th call as an unreachable service does."""

    def __init__(self, pool, every: int):
        self.pool, self.every, self.calls = pool, every, 0

    async def run(self, code, input: str = "", **kw) -> ExecResult:
        self.calls += 1
        if self.calls % self.every == 0:
            return ExecResult.failure("internal", "code environment unavailable: connection refused")
        return await self.pool.run(code, input, **kw)


def config(model, tmp_path, **run) -> dict:
    rows = [{"problem": f"What is {i} * 3?", "answer": str(3 * i)} for i in range(4)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tree = rl_config(model, tmp_path / "train.jsonl", tmp_path / "run")
    tree["rollout"].update(max_response_tokens=120, max_turns=2)
    tree["run"].update(steps=1, batch_size=2, **run)
    return tree


async def train(tree: dict, code_env, verifier) -> list[dict]:
    threads = torch.get_num_threads()
    try:
        return await RLTrainer(parse_config(tree), code_env=code_env, verifier=verifier).train()
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
async def test_rollouts_the_code_environment_spoiled_are_counted_and_never_trained_on(
    tool_caller, pool, verifier, tmp_path
):
    flaky = FlakyEnvironment(pool, every=3)
    history = await train(config(tool_caller, tmp_path, max_fault_share=1.0), flaky, verifier)
    samples = [
        json.loads(x) for x in (tmp_path / "run" / "samples" / "step_000001.jsonl").read_text().splitlines()
    ]
    spoiled = [s for s in samples if s["fault"]]
    assert spoiled and len(spoiled) < len(samples)  # some, not all
    assert all(
        s["fault"] == "sandbox" and s["meta"]["roc"] == {"kept": False, "fault": "sandbox"} for s in spoiled
    )
    assert all(
        (c["result"] or {}).get("status") != "internal"
        for s in samples
        if not s["fault"]
        for t in s["turns"]
        for c in t["calls"]
    )
    m = read_metrics(tmp_path / "run" / "metrics.jsonl")[0]
    assert m["faults/sandbox"] == pytest.approx(len(spoiled) / len(samples))
    assert m["rollouts"] == len(samples) and m["faults/engine"] == 0.0
    assert history[0]["rollouts_kept"] <= len(samples) - len(spoiled)


@pytest.mark.slow
async def test_a_step_mostly_spoiled_by_faults_stops_saying_what_failed(
    tool_caller, pool, verifier, tmp_path
):
    with pytest.raises(RunError, match="RL step 1 failed") as err:
        await train(config(tool_caller, tmp_path), FlakyEnvironment(pool, every=1), verifier)
    said = str(err.value)
    assert re.search(r"1[2-6] of 16 rollouts failed \(more than run.max_fault_share=0.5\)", said), said
    assert "code environment: internal: code environment unavailable" in said
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing was trained on


def record(fault: str | None, correct: bool, calls: int = 1, failed: int = 0) -> dict:
    return {
        "reward": float(correct), "correct": correct, "kept": True, "tokens": 10, "model_tokens": 8, "turns": 2,
        "finish": "error" if fault == "engine" else "answer", "calls": calls, "failed": failed,
        "p_err": 0.0, "p_format": 0.0, "tool_s": 0.0, "reward_s": 0.0, "fault": fault,
    }  # fmt: skip


def test_step_metrics_leave_faults_out_of_accuracy_and_count_them_by_kind():
    records = [
        record(None, True),
        record(None, False, failed=1),
        record("engine", False),
        record("sandbox", False),
    ]
    records.append(record("verifier", False))
    m = step_metrics(records)
    assert m["accuracy"] == 0.5 and m["tools/error_ratio_all"] == 0.5  # over the two the system did not spoil
    assert m["faults/engine"] == m["faults/sandbox"] == m["faults/verifier"] == pytest.approx(1 / 5)
    assert m["rollouts"] == 5.0 and m["finish/error"] == 0.0
