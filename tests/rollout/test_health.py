"""Tool-use health: which signs a rollout shows, a step's shares, the watch's warnings and stop, and
the cut flag set where the model's tool response is made."""

from __future__ import annotations

import json

import pytest

from rstar2.config import HealthSection, RolloutSection
from rstar2.config_files import parse_config
from rstar2.rollout import Rollout
from rstar2.rollout.health import SIGNS, Watch, shares, signs
from rstar2.rollout.stats import record
from rstar2.rollout.trajectory import ToolCallRecord, Trajectory, Turn
from rstar2.sandbox.result import ExecResult

from .test_rollout import call, scripted


def traj(*turns: list[ToolCallRecord], skipped: int = 0) -> Trajectory:
    t = Trajectory("p", "1", [1])
    t.turns = [Turn("text", 3, list(calls)) for calls in turns] or [Turn("text", 3)]
    t.turns[0].skipped_calls = skipped
    return t


def ran(code: str, status: str = "ok", cut: bool = False, **result) -> ToolCallRecord:
    return ToolCallRecord("python", {"code": code}, "out", ExecResult(status, **result), cut=cut)


MALFORMED = ToolCallRecord(None, {}, "Tool call failed: not JSON.", None, "not JSON")


@pytest.mark.parametrize(
    "t, shown",
    [
        (traj(), {"no_call"}),
        (traj(skipped=1), set()),  # a call past the per-turn maximum was still written
        (traj([ran("print(1)")]), set()),
        (traj([MALFORMED]), {"unparseable"}),
        (traj([MALFORMED], [MALFORMED]), {"unparseable"}),  # malformed twice is no repeat
        (traj([ran("print(1)\n\n")], [ran("  print(1)")]), {"repeated"}),  # nor is whitespace
        (traj([ran("print(1)")], [ran("print(2)")]), set()),
        (traj([ran("print(1)", cut=True)]), {"output_cut"}),
        (traj([ran("print(1)", truncated=True)]), {"output_cut"}),  # cut by the code environment
        (traj([ran("print(1)" * 9, "output_limit")]), {"output_cut"}),
        (traj([ran("x", "error")], [ran("x", "error")], [MALFORMED]), {"repeated", "unparseable"}),
    ],
)
def test_signs_of_one_rollout(t, shown):
    assert {s for s, on in signs(t).items() if on} == shown
    back = Trajectory.from_dict(json.loads(json.dumps(t.to_dict())))
    assert signs(back) == signs(t)  # the viewer reads them back from JSON


def test_shares_over_records():
    records = [
        record(traj()),
        record(traj([MALFORMED])),
        record(traj([ran("a")], [ran("a")])),
        record(traj()),
    ]
    assert shares(records) == {"no_call": 0.5, "unparseable": 0.25, "repeated": 0.25, "output_cut": 0.0}
    assert shares([]) == dict.fromkeys(SIGNS, 0.0)


def step(no_call: float, unparseable: float = 0.0) -> dict:
    return {"health/no_call": no_call, "health/unparseable": unparseable, "health/repeated": 1.0}


def test_the_watch_warns_each_step_over_a_limit_and_stops_after_patience():
    watch = Watch({"no_call": 0.5, "unparseable": 0.2, "repeated": None}, patience=2, stop=True)
    w1 = watch.observe(1, step(0.75))
    assert [(w.sign, w.share, w.limit, w.steps_over) for w in w1] == [("no_call", 0.75, 0.5, 1)]
    assert (
        "75% of rollouts show no tool call" in w1[0].message and "run.health.no_call = 0.5" in w1[0].message
    )
    assert watch.stop_reason(w1) is None  # one step over: only a warning
    assert watch.observe(2, step(0.5)) == []  # at the limit is healthy, and the count starts over
    watch.observe(3, step(0.9, 0.3))
    w4 = watch.observe(4, step(0.9, 0.1))
    assert [(w.sign, w.steps_over) for w in w4] == [("no_call", 2)]
    said = watch.stop_reason(w4)
    assert said and "stopped by run.health: no tool call in 90% of rollouts" in said
    assert "for 2 steps in a row" in said and "run.health.stop: false" in said
    assert Watch({"no_call": 0.5}, patience=1, stop=False).stop_reason(w4) is None  # warn only


def test_health_limits_are_checked_in_the_config():
    assert HealthSection().stop is False and HealthSection().no_call == 0.5
    with pytest.raises(ValueError, match="less than or equal to 1"):
        HealthSection(no_call=1.5)
    with pytest.raises(ValueError, match="extra"):
        HealthSection(no_calls=0.1)
    cfg = parse_config(
        {"kind": "rl", "model": {"path": "m"}, "data": {"train": "t"}, "run": {"health": {"repeated": None}}}
    )
    assert cfg.run.health.repeated is None


def test_tool_responses_say_when_the_model_reads_less_than_was_printed(chatml):
    from dataclasses import replace

    text, cut = chatml.tool_response(ExecResult("ok", stdout="short\n"))
    assert (text, cut) == ("short", False)
    long = ExecResult("ok", stdout="x" * 5000)
    assert chatml.tool_response(long)[1] is True  # over tool_limit_chars
    assert chatml.tool_response(ExecResult("ok", stdout="y\n", truncated=True)) == ("y", True)
    by_tokens = replace(chatml, tool_limit_chars=100_000, tool_limit_tokens=8)
    text, cut = by_tokens.tool_response(ExecResult("ok", stdout="word " * 50))
    assert cut and "tokens cut" in text


async def test_a_rollout_records_cut_output_and_the_signs(chatml, tiny, pool, verifier):
    scripts = {
        "floods": [call("print('z' * 3000)"), "<answer> \\boxed{1} </answer>"],
        "repeats": [call("print(1)"), call("print(1)"), "<answer> \\boxed{1} </answer>"],
        "garbles": ["<tool_call>{not json</tool_call>", "<answer> \\boxed{1} </answer>"],
        "skips": ["<answer> \\boxed{1} </answer>"],
    }
    engine = scripted(chatml, tiny)
    engine.scripts = scripts
    rollout = Rollout(engine, chatml, pool, verifier, RolloutSection(max_turns=3, tool_limit_chars=300))
    got = {t.problem: t for t in await rollout.run_many([{"problem": p, "answer": "1"} for p in scripts])}
    flood = got["floods"].calls[0]
    assert flood.cut and not flood.result.truncated and "characters cut" in flood.response
    assert not got["repeats"].calls[0].cut
    shown = {p: {s for s, on in signs(t).items() if on} for p, t in got.items()}
    assert shown == {
        "floods": {"output_cut"},
        "repeats": {"repeated"},
        "garbles": {"unparseable"},
        "skips": {"no_call"},
    }
