"""Multi-turn rollouts: stop conditions, budgets, concurrency, failures, and a real-model run."""

from __future__ import annotations

import json

import torch

from rstar2.chat.tools import PYTHON_TOOL
from rstar2.config import RolloutSection, SchedulerSection
from rstar2.engines.hf import HFEngine
from rstar2.rollout import Rollout, Trajectory

from .conftest import ScriptedEngine


def call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": PYTHON_TOOL, "arguments": {"code": code}}) + "</tool_call>"


SCRIPTS = {
    "answers": ["<reason> 2 + 2 </reason>" + call("print(2 + 2)"), "<answer> \\boxed{4} </answer>"],
    "wrong": ["<answer> \\boxed{5} </answer>"],
    "silent": ["<reason> I just stop. </reason>"],
    "loops": [call("print(1)")] * 5,
    "rambles": ["<reason> " + "and so on " * 200 + "</reason>"],
    "slow": [call("import time; time.sleep(4); print('late')"), "<answer> \\boxed{0} </answer>"],
    "two calls": [call("print(1)") + call("print(2)"), "<answer> \\boxed{1} </answer>"],
}


def scripted(chatml, tiny):
    return ScriptedEngine(
        chatml, SCRIPTS, tiny[1].convert_tokens_to_ids("<|im_end|>"), "<|im_start|>assistant"
    )


async def test_every_stop_condition(chatml, tiny, pool, verifier):
    engine = scripted(chatml, tiny)
    rollout = Rollout(engine, chatml, pool, verifier, RolloutSection(max_turns=3, max_response_tokens=300))
    items = [
        {"problem": p, "answer": "4"} for p in ("answers", "wrong", "silent", "loops", "rambles", "two calls")
    ]
    got = {t.problem: t for t in await rollout.run_many(items)}
    assert (got["answers"].finish_reason, got["answers"].reward, got["answers"].answer) == (
        "answer",
        1.0,
        "4",
    )
    assert (got["wrong"].finish_reason, got["wrong"].reward) == ("answer", 0.0)
    assert got["silent"].finish_reason == "no_tool_call"
    assert got["loops"].finish_reason == "max_turns" and len(got["loops"].turns) == 3
    assert got["rambles"].finish_reason == "max_length" and got["rambles"].response_tokens == 300
    assert got["rambles"].reward == 0.0
    two = got["two calls"]  # one call per turn by default: the second is not run, and the model is told
    assert two.num_calls == 1 and two.turns[0].skipped_calls == 1
    assert "not run" in chatml.decode(two.response_ids)
    for t in got.values():
        assert len(t.response_ids) == len(t.loss_mask) == len(t.logprobs) <= 300


async def test_a_slow_tool_call_never_stalls_other_trajectories(chatml, tiny, pool, verifier):
    engine = scripted(chatml, tiny)
    # a roomy limit: this tests overlap, not limits (a 4 s sleep once hit the pool's 5 s on a loaded VM)
    rollout = Rollout(engine, chatml, pool, verifier, RolloutSection(max_turns=3, tool_timeout_s=60))
    order: list[str] = []
    items = [{"problem": "slow", "answer": "0"}] + [{"problem": "answers", "answer": "4"}] * 4
    done = await rollout.run_many(items, on_done=lambda t: order.append(t.problem))
    assert order[-1] == "slow" and order[:4] == ["answers"] * 4  # everyone else finished during its sleep
    assert done[0].calls[0].response == "late" and done[0].reward == 1.0


class Broken:
    name = "broken"
    capacity_tokens = 1000
    in_flight = 0

    async def generate(self, prompt_ids, params):
        raise ConnectionError("engine went away")


class DeadSandbox:
    async def run(self, *a, **kw):
        raise ConnectionError("sandbox service down")


async def test_failures_end_one_trajectory_or_become_tool_errors(chatml, tiny, pool, verifier):
    traj = await Rollout(Broken(), chatml, pool, verifier).run("answers", "4")
    assert traj.finish_reason == "error" and "engine went away" in traj.verdict and traj.reward == 0
    traj = await Rollout(scripted(chatml, tiny), chatml, DeadSandbox(), verifier).run("answers", "4")
    assert traj.calls[0].status == "internal" and "unavailable" in traj.calls[0].response
    assert traj.finish_reason == "answer"  # the model went on after the failed call


async def test_trajectory_round_trips_through_json(chatml, tiny, pool, verifier):
    traj = await Rollout(scripted(chatml, tiny), chatml, pool, verifier).run("answers", "4")
    back = Trajectory.from_dict(json.loads(json.dumps(traj.to_dict())))
    assert back.to_dict() == traj.to_dict() and back.calls[0].result.ok


async def test_a_failing_engine_is_taken_out_and_its_turns_finish_elsewhere(chatml, tiny, pool, verifier):
    broken = Broken()
    broken.capacity_tokens = 1 << 22  # the roomiest: the kv policy sends the first turns there
    rollout = Rollout([broken, scripted(chatml, tiny)], chatml, pool, verifier, RolloutSection(max_turns=3))
    trajs = await rollout.run_many([{"problem": "answers", "answer": "4"}] * 6)
    assert all(t.finish_reason == "answer" and t.reward == 1.0 for t in trajs)
    assert {turn.engine for t in trajs for turn in t.turns} == {"scripted"}
    assert rollout.scheduler.policy.alive == [False, True]


async def test_a_turn_granted_in_pieces_is_the_same_turn(chatml, tiny, pool, verifier):
    """With grants of 3 tokens the engine is asked several times per turn; the trajectory is the
    one a whole-turn request gives."""
    whole = await Rollout(scripted(chatml, tiny), chatml, pool, verifier).run("answers", "4")
    engine = scripted(chatml, tiny)
    grants = RolloutSection(scheduler=SchedulerSection(grant_tokens=3))
    pieces = Rollout(engine, chatml, pool, verifier, grants)
    traj = await pieces.run("answers", "4")
    assert traj.response_ids == whole.response_ids and traj.loss_mask == whole.loss_mask
    assert traj.reward == 1.0 and len(engine.generated["answers"]) > 2 * len(traj.turns)


async def test_a_real_model_rollout_batch(tiny, chatml, pool, verifier):
    """Random weights, real sampling: ids, mask and logprobs stay consistent with a teacher-forced
    pass of the trainer-side model over the whole sequence (tool tokens included)."""
    model, tok = tiny
    engines = [HFEngine(model, name=f"e{i}", max_batch_size=8) for i in range(2)]
    cfg = RolloutSection(max_turns=3, max_response_tokens=64, temperature=1.0)
    rollout = Rollout(engines, chatml, pool, verifier, cfg)
    trajs = await rollout.run_many(
        [{"problem": f"What is {i} + {i}?", "answer": str(2 * i), "seed": i} for i in range(6)]
    )
    assert {t.turns[0].engine for t in trajs} == {"e0", "e1"}  # both engines served
    for t in trajs:
        assert t.finish_reason in ("max_length", "no_tool_call", "answer", "max_turns")
        ids = t.prompt_ids + t.response_ids
        with torch.no_grad():
            logp = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
        start = len(t.prompt_ids)
        for k, (tok_id, m, lp) in enumerate(zip(t.response_ids, t.loss_mask, t.logprobs, strict=True)):
            if m:
                assert abs(logp[start + k - 1, tok_id].item() - lp) < 1e-3
    for e in engines:
        await e.close()


class FixedVerifier:
    """A verifier that answers every check the same way (or fails), for the runner's bookkeeping."""

    def __init__(self, verdict=None, error: Exception | None = None):
        self.verdict, self.error = verdict, error

    async def acheck(self, reference, response, **options):
        if self.error is not None:
            raise self.error
        return self.verdict


async def test_faults_of_the_system_are_marked_and_the_models_own_failures_are_not(chatml, tiny, pool):
    from rstar2.reward.equivalence import Verdict
    from rstar2.sandbox.result import ExecResult

    class Unreachable:
        async def run(self, request, input="", **kw):
            return ExecResult.failure("internal", "code environment unavailable")

    cfg = RolloutSection(max_turns=3)
    cases = {
        "verifier error": (pool, FixedVerifier(error=RuntimeError("pool closed")), "verifier"),
        "verifier starved": (pool, FixedVerifier(Verdict(False, "stalled", "4", "stalled")), "verifier"),
        "hostile answer": (pool, FixedVerifier(Verdict(False, "timeout", "4", "timeout")), None),
        "sandbox down": (Unreachable(), FixedVerifier(Verdict(True, "equal", "4", "fast")), "sandbox"),
        "all well": (pool, FixedVerifier(Verdict(True, "equal", "4", "fast")), None),
    }
    for name, (code_env, verifier, fault) in cases.items():
        traj = await Rollout(scripted(chatml, tiny), chatml, code_env, verifier, cfg).run("answers", "4")
        assert traj.fault == fault, (name, traj.fault, traj.verdict)
        assert traj.reward == (1.0 if name in ("all well", "sandbox down") else 0.0), name
    broken = await Rollout(FailingEngine(), chatml, pool, FixedVerifier(), cfg).run("answers", "4")
    assert broken.fault == "engine" and broken.finish_reason == "error"


class FailingEngine:
    name, capacity_tokens, in_flight = "down", 1 << 20, 0

    async def generate(self, prompt_ids, params):
        raise ConnectionError("http://gpu9:8000 unreachable")

    async def close(self):
        pass
