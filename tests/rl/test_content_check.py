"""The check of what an engine computes after each load (rl/run/content_check.py): the verdict
on hand-made numbers, and whole runs beside a real `rstar2 serve` that answers every load from the
second on as done (its version and the fingerprint of the tensors sent) but keeps its weights
(``PRETEND_LOADS_FROM``): at k = 0 and k = 1 it leaves the run, said, and none of its tokens labelled
with a version it did not serve is trained."""

from __future__ import annotations

import json

import pytest

from rstar2.engines.served_weights import PRETEND_LOADS_FROM
from rstar2.rl.run.content_check import FLOOR, MARGIN, ContentCheck, Probe, tolerance, verdict

from ..conftest import free_port, start_cli, stop, wait_http
from .test_scale_out import cli, env, small_rl, write_config


def test_the_tolerance_is_the_engines_honest_gap_times_the_margin_between_floor_and_cap():
    assert tolerance(1e-3, cap=0.1) == pytest.approx(MARGIN * 1e-3)
    assert tolerance(6e-8, cap=0.1) == FLOOR  # rounding alone: the floor
    assert tolerance(0.05, cap=0.1) == 0.1  # never above the cap


def test_an_engine_far_from_the_new_policy_fails():
    now = Probe([5, 6], engine=[-1.0, -2.0], trainer=[-1.0, -2.01])  # mean gap 0.005
    assert verdict(now, None, tol=0.01) is None
    assert "0.005 > its tolerance 0.001" in verdict(now, None, tol=0.001)


def test_an_engine_nearer_the_previous_policy_fails_where_the_update_moved_the_probe():
    before = Probe([5, 6, 7], engine=[-1.0, -2.0, -3.0], trainer=[-1.0, -2.0, -3.0])
    # the update moved the trainer's log-probs by 0.003 on average; the engine 0.0014 of the way:
    # within 0.0016 of the new policy, but within 0.0014 of the previous one
    stale = Probe([5, 6, 7], engine=[-1.0014, -2.0014, -3.0014], trainer=[-1.003, -2.003, -3.003])
    why = verdict(stale, before, tol=0.004)  # within the tolerance of the new policy...
    assert why is None  # ...and the update moved less than the tolerance: nothing to tell them apart
    why = verdict(stale, before, tol=0.002)
    assert "nearer the previous policy" in why and "over 3 probe tokens" in why
    moved = Probe([5, 6, 7], engine=[-1.0025, -2.0025, -3.0025], trainer=[-1.003, -2.003, -3.003])
    assert verdict(moved, before, tol=0.002) is None  # it took the update
    other = Probe([9, 6, 7], engine=stale.engine, trainer=stale.trainer)  # other tokens: no common prefix
    assert verdict(other, before, tol=0.002) is None


def test_the_record_calibrates_at_the_first_probe_and_refuses_another_model():
    check = ContentCheck(cap=0.1)
    assert "computes another model" in check.judge("a", Probe([1], [-1.0], [-1.5]))
    assert check.judge("b", Probe([1, 2], [-1.0, -2.0], [-1.0, -2.0 + 2e-5])) is None
    assert check.tolerances["b"] == pytest.approx(MARGIN * 1e-5)
    assert "> its tolerance" in check.judge("b", Probe([1, 2], [-1.0, -2.0], [-1.0, -2.01]))
    assert check.last["b"].trainer == [-1.0, -2.0 + 2e-5]  # a failed answer is not the next reference


def serve(model_dir, weights_from, pretend_from: int | None = None):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["serve", "--model", str(model_dir), "--port", str(port), "--device", "cpu"]
    extra = {PRETEND_LOADS_FROM: str(pretend_from)} if pretend_from else {}
    return url, start_cli([*args, "--weights-from", str(weights_from)], env={**env(), **extra})


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("k, lora", [(0, False), (1, False), (1, True)], ids=["k=0", "k=1", "k=1-adapter"])
def test_a_server_that_says_it_loaded_and_did_not_leaves_the_run_untrained_on(k, lora, tiny_dir, tmp_path):
    """Server b takes the run's first weights (version 0) and the first update and pretends from
    version 2 on (load 3; with an adapter, load 4: the base goes first); a serves honestly."""
    pretend_from = 4 if lora else 3
    (a, pa), (b, pb) = serve(tiny_dir, tmp_path), serve(tiny_dir, tmp_path, pretend_from=pretend_from)
    out = tmp_path / "run"
    problems = tmp_path / "train.jsonl"
    rows = [{"problem": f"What is {i} * {i + 1}?", "answer": str(i * (i + 1))} for i in range(12)]
    problems.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tree = small_rl(tiny_dir, problems, out, steps=4, servers=[a, b], max_staleness=k)
    # an update small enough that the fixed 0.1-nat tolerance of old would not see it missed
    tree["optim"]["lr"] = 1e-3 if lora else 1e-4
    if lora:
        tree["model"]["lora"] = {"rank": 4, "alpha": 8}
    if k:
        tree["loss"] = {"tis_cap": 2.0}
        tree["rollout"]["top_k"] = 0  # the correction's mu is the untruncated distribution
    try:
        wait_http(a, pa), wait_http(b, pb)
        run = cli(["train", str(write_config(tree, tmp_path / "rl.yaml"))])
    finally:
        stop(pa), stop(pb)
    said = " ".join(run.stderr.split())
    assert run.returncode == 0, said[-3000:]
    assert f"engine {b} does not serve the weights it says it holds" in said, said[-3000:]
    assert "with the weights of version 2" in said, said[-3000:]
    trained = [
        t
        for f in sorted((out / "samples").glob("*.jsonl"))
        for t in map(json.loads, f.read_text().splitlines())
        if t["meta"]["roc"]["kept"]
    ]
    from_b = [
        v for t in trained for v, m in zip(t["versions"], t["loss_mask"], strict=True) if m and _on(t, b)
    ]
    assert from_b and max(from_b) < 2, from_b  # b's tokens of versions 0 and 1 were its own; none after


def _on(traj: dict, engine: str) -> bool:
    return any(turn["engine"] == engine for turn in traj["turns"])


def test_a_rollout_is_spoiled_only_by_tokens_of_the_untrue_engine_at_or_after_its_version():
    from rstar2.rl.run.content_check import untrue_turn
    from rstar2.rollout.trajectory import Trajectory, Turn

    traj = Trajectory("p", "1", [1, 2])
    traj.turns = [Turn("a", 2, tool_tokens=1, engine="good"), Turn("b", 2, engine="liar")]
    traj.versions = [3, 3, -1, 1, 2]  # turn 1 on good (v3), a tool token, turn 2 on liar (v1, v2)
    assert untrue_turn(traj, {}) is None
    assert untrue_turn(traj, {"liar": 3}) is None  # its tokens predate the load it did not serve
    assert "engine liar" in untrue_turn(traj, {"liar": 2})
    assert untrue_turn(traj, {"good": 4}) is None
    assert "engine good" in untrue_turn(traj, {"good": 3})
