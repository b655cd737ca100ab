"""A custom reward (the RL trainer's ``reward:``): given to the rollout when it is built, scoring in
the verifier's place, and computed off the event loop so that a slow one stalls only its own rollout."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rstar2.config import RolloutSection
from rstar2.rollout import Rollout
from rstar2.rollout.build import open_rollout

from .conftest import ScriptedEngine

SCRIPTS = {p: [f"<answer> \\boxed{{{p}}} </answer>"] for p in ("slow", "quick", "brisk")}
WAIT_S = 5.0  # a bound on each wait below, so that a broken rollout fails the test instead of hanging it


def scripted(chatml, tiny):
    return ScriptedEngine(
        chatml, SCRIPTS, tiny[1].convert_tokens_to_ids("<|im_end|>"), "<|im_start|>assistant"
    )


class NoVerifier:
    """The verifier of a rollout with a custom reward: never asked."""

    async def acheck(self, reference, response, **options):
        raise AssertionError("the custom reward scores in the verifier's place")


class NoCodeEnv:
    async def run(self, code, input="", **kw):
        raise AssertionError("these scripts call no tool")


async def test_a_slow_custom_reward_stalls_only_its_own_rollout(chatml, tiny):
    """The reward of "slow" waits until the other rollouts are done: they can only be, and its wait
    only ends, when the rewards do not run on the event loop (there it would hold every rollout up)."""
    others_done = threading.Event()
    seen: dict[str, object] = {}
    loop_thread = threading.get_ident()

    def reward(traj) -> float:
        seen.setdefault("threads", set()).add(threading.get_ident())
        if traj.problem == "slow":
            seen["others_done_in_time"] = others_done.wait(WAIT_S)
        return {"slow": 0.25, "quick": 1.0, "brisk": 0.0}[traj.problem]

    finished: list[str] = []

    def on_done(traj) -> None:
        finished.append(traj.problem)
        if {"quick", "brisk"} <= set(finished):
            others_done.set()

    cfg = RolloutSection(max_turns=2)
    rollout = Rollout(scripted(chatml, tiny), chatml, NoCodeEnv(), NoVerifier(), cfg, reward=reward)
    try:
        items = [{"problem": p, "answer": "4"} for p in ("slow", "quick", "brisk")]
        trajs = await asyncio.wait_for(rollout.run_many(items, on_done=on_done), 3 * WAIT_S)
    finally:
        rollout.close()
    assert seen["others_done_in_time"] is True  # the others finished while "slow" was in its reward
    assert finished[-1] == "slow"
    assert [t.reward for t in trajs] == [0.25, 1.0, 0.0]  # in the verifier's place, in item order
    assert all(t.fault is None and t.finish_reason == "answer" for t in trajs)
    assert loop_thread not in seen["threads"]


async def test_a_failing_custom_reward_fails_the_run_as_before(chatml, tiny):
    """A broken reward is the config's error: ``run`` raises it (it is not one rollout's fault)."""

    def reward(traj) -> float:
        raise ValueError(f"no reward for {traj.problem}")

    rollout = Rollout(scripted(chatml, tiny), chatml, NoCodeEnv(), NoVerifier(), reward=reward)
    with pytest.raises(ValueError, match="no reward for quick"):
        await rollout.run("quick", "4")
    rollout.close()


async def test_open_rollout_builds_the_rollout_with_its_reward(chatml, tiny):
    """The trainer's way in: the reward is the rollout's from the start, and its threads go with it."""
    calls: list[str] = []

    def reward(traj) -> float:
        calls.append(traj.problem)
        return 0.5

    settings = RolloutSection(max_turns=2)
    async with open_rollout(
        settings,
        tokenizer=tiny[1],
        engines=[scripted(chatml, tiny)],
        code_env=NoCodeEnv(),
        verifier=NoVerifier(),
        reward=reward,
    ) as rollout:
        assert rollout.reward is reward
        traj = await rollout.run("brisk", "4")
    assert (traj.reward, calls) == (0.5, ["brisk"])
    assert rollout._reward_threads is None  # closed on leaving
