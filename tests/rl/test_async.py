"""Asynchronous RL with bounded staleness (``asynchronous.max_staleness``): k = 0 is the synchronous loop
byte for byte; admission keeps every trained token within k updates of its sampler; tokens record
the policy version that sampled them; k > 0 needs the off-policy correction."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import torch

from rstar2.config_files import ConfigError, parse_config
from rstar2.engines.base import SamplingParams
from rstar2.engines.hf import HFEngine
from rstar2.rl.algorithm.staleness import admissible, staleness_metrics
from rstar2.rl.run.checkpoint import latest_checkpoint
from rstar2.rl.run.metrics_log import read_metrics
from rstar2.rl.run.step_metrics import engine_metrics
from rstar2.rl.trainer import RLTrainer
from tests.rl.test_trainer import place, rl_config


def _config(tiny_dir, root, out, steps=3, **rollout):
    tree = place(rl_config(tiny_dir, root / "train.jsonl", root / out), **rollout)
    tree["run"].update(steps=steps, save_every=steps)
    if rollout.get("max_staleness"):
        tree["loss"] = {"tis_cap": 2.0}
        tree["rollout"]["top_k"] = 0  # the correction's mu is the untruncated distribution
    return parse_config(tree)


def assert_versions_in_bound(run: Path, k: int) -> None:
    """Every logged step's staleness in [0, k] (logged when k > 0), and every sampled model token's version
    reported (>= 0) and in [step - 1 - k, step - 1] (the trainer refuses a step otherwise; this reads
    what it trained)."""
    rows = read_metrics(run / "metrics.jsonl")
    assert rows and all(0 <= r["staleness/mean"] <= r["staleness/max"] <= k for r in rows if k), rows
    for r in rows:
        lines = (run / "samples" / f"step_{r['step']:06d}.jsonl").read_text().splitlines()
        for t in map(json.loads, lines):
            model = [v for v, m in zip(t["versions"], t["loss_mask"], strict=True) if m]
            assert model and all(v >= 0 and 0 <= r["step"] - 1 - v <= k for v in model), (
                run,
                r["step"],
                model,
            )


def _train(cfg, trainer=RLTrainer, resume=False):
    threads = torch.get_num_threads()
    try:
        return asyncio.run(trainer(cfg, resume=resume).train())
    finally:
        torch.set_num_threads(threads)


class LockstepTrainer(RLTrainer):
    """The plain synchronous loop, written out as the reference: each step takes its problems,
    samples all their rollouts, then trains on them (no feed)."""

    async def rollouts(self):
        cfg, world = self.cfg, self.world
        step = self.step_no + 1
        problems = self.problems.take(cfg.run.batch_size)
        own = list(range(world.rank, len(problems), world.size))
        items = [item for g in own for item in self._items(step, g, problems[g])]
        self.model.eval()
        trajs = await self.rollout.run_many(items)
        S = cfg.rollout.samples
        return own, [trajs[i * S : (i + 1) * S] for i in range(len(own))]


def test_staleness_without_a_correction_is_refused(tiny_dir, data):
    tree = rl_config(tiny_dir, data / "train.jsonl", data / "refused")
    tree["asynchronous"] = {"max_staleness": 1}
    with pytest.raises(ConfigError, match="loss.tis_cap"):
        parse_config(tree)
    tree["loss"] = {"tis_cap": 2.0}
    # mu is the engine's probability before top-k/top-p: the correction would be wrong, so refused
    with pytest.raises(ConfigError, match="top_k: 0 and top_p: 1"):
        parse_config(tree)  # rl_config samples with top_k: 4
    tree["rollout"]["top_k"] = 0
    assert parse_config(tree).asynchronous.max_staleness == 1
    tree["rollout"]["top_p"] = 0.9
    with pytest.raises(ConfigError, match="top_k: 0 and top_p: 1"):
        parse_config(tree)
    tree["rollout"]["top_p"] = 1.0
    # the correction left out on purpose (an ablation) is said, not defaulted: tis_cap null written out
    tree["loss"] = {"tis_cap": None}
    assert parse_config(tree).loss.tis_cap is None
    # a key written where it does not live (here: where it lived before) is an unknown key, named
    tree["loss"] = {"correction": "none"}
    with pytest.raises(ConfigError, match="loss.correction: unknown key"):
        parse_config(tree)
    tree["loss"] = {"tis_cap": 2.0}
    tree["rollout"]["max_staleness"] = 1
    with pytest.raises(ConfigError, match="rollout.max_staleness: unknown key"):
        parse_config(tree)
    del tree["rollout"]["max_staleness"]
    tree["rollout"]["scheduler"] = "kv"
    with pytest.raises(ConfigError, match="rollout.scheduler: Input should be a valid dictionary"):
        parse_config(tree)
    tree["rollout"]["scheduler"] = {"policy": "kv"}
    tree["rollout"]["engine_retries"] = 1
    with pytest.raises(ConfigError, match="rollout.engine_retries: unknown key"):
        parse_config(tree)


def test_admission_keeps_every_group_within_k_updates():
    """Group i is trained at step i // B; it may start while the policy is at version v only if
    i // B - v <= k. At k = 0 only the current step's groups may start."""
    B = 4
    assert [admissible(i, version=0, batch_size=B, max_staleness=0) for i in range(9)] == [True] * 4 + [
        False
    ] * 5
    assert [admissible(i, version=2, batch_size=B, max_staleness=1) for i in range(8, 17)] == [True] * 8 + [
        False
    ]
    for k in range(3):
        for version in range(4):
            for i in range(40):
                if admissible(i, version=version, batch_size=B, max_staleness=k):
                    assert i // B - version <= k


async def test_the_feed_starts_no_group_past_the_runs_last_step():
    """At k = 2 the feed runs up to two steps ahead, but never past ``run.steps``: no rollouts are
    generated only to be thrown away at the end of a run or a stage."""
    from rstar2.rl.run.feed import GroupFeed

    started = []

    async def launch(i):
        started.append(i)
        return i

    feed = GroupFeed(launch, first_step=1, last_step=3, batch_size=2, max_staleness=2)
    assert await feed.step(1) == [2, 3]
    assert started == [2, 3, 4, 5]  # steps 2 and 3; step 4 (groups 6, 7) is past the end
    assert await feed.step(2) == [4, 5] and started == [2, 3, 4, 5]
    await feed.close()


def test_a_token_outside_the_bound_stops_the_step_naming_its_engine():
    """Checked per token from the recorded versions, before the update; tool tokens (-1) carry no
    version and are not model tokens."""
    from rstar2.rl.algorithm.staleness import StalenessError, check_versions
    from rstar2.rollout.trajectory import Trajectory, Turn

    def traj(versions_per_turn, engine="http://a:8000"):
        t = Trajectory("p", "1", [1])
        for vs in versions_per_turn:
            t.turns.append(Turn("x", len(vs), tool_tokens=2, engine=engine))
            t.versions += list(vs) + [-1, -1]
            t.loss_mask += [1] * len(vs) + [0, 0]
        return t

    check_versions([traj([[4, 4], [5]]), traj([[5, 5]])], trained_by=5, max_staleness=1)
    with pytest.raises(StalenessError, match=r"engine http://b:9 sampled a token with policy version 3"):
        check_versions([traj([[5]]), traj([[4], [3]], "http://b:9")], trained_by=5, max_staleness=1)
    # ahead of the trainer: a server on another run's weights (or this run's after a resume)
    with pytest.raises(StalenessError, match=r"version 9, outside \[5, 5\]"):
        check_versions([traj([[9, 9]])], trained_by=5, max_staleness=0)
    # in the first k steps the bound would reach below 0: an unreported token (-1) is refused there too
    for step in range(3):
        with pytest.raises(StalenessError, match=r"version -1, outside \[0, .*did not report it"):
            check_versions([traj([[0, -1]])], trained_by=step, max_staleness=2)


def test_staleness_metrics_by_hand():
    # trained by version 5: model tokens sampled by 5, 4 and 3, and one no engine reported (-1)
    versions = [[5, 5, -1, 4], [3, 3, 3], [4, 5]]
    m = staleness_metrics(versions, trained_by=5)
    assert m["staleness/max"] == 2
    assert m["staleness/mean"] == pytest.approx((0 + 0 + 1 + 2 + 2 + 2 + 1 + 0) / 8)
    assert m["staleness/multi_version_share"] == pytest.approx(2 / 3)
    assert m["staleness/unreported_tokens"] == 1


def test_engine_metrics_by_hand():
    """Two engines' counters at a step's start and end (10 s); a third without counters is left out."""
    c = dict(steps=0, row_steps=0, busy_s=0.0, prefill_s=0.0, evictions=0, reprefills=0)
    c.update(queue_wait_s=0.0, requests=0)
    before = [{**c, "rows": 8}, {**c, "rows": 4, "steps": 5, "row_steps": 20}, None]
    after = [
        {
            **c,
            "rows": 8,
            "steps": 10,
            "row_steps": 60,
            "busy_s": 6.0,
            "prefill_s": 1.5,
            "requests": 4,
            "queue_wait_s": 2.0,
            "evictions": 3,
        },
        {
            **c,
            "rows": 4,
            "steps": 15,
            "row_steps": 50,
            "busy_s": 4.0,
            "prefill_s": 0.5,
            "requests": 1,
            "reprefills": 2,
        },
        None,
    ]
    m = engine_metrics(before, after, wall_s=10.0)
    assert m["engine/occupancy"] == pytest.approx((60 + 30) / (8 * 10 + 4 * 10))
    assert m["engine/join_share"] == pytest.approx(2.0 / 10.0)
    assert m["engine/busy_share"] == pytest.approx(10.0 / 20.0)
    assert m["engine/evictions"] == 3 and m["engine/reprefills"] == 2
    assert m["engine/queue_wait_s"] == pytest.approx(2.0 / 5)
    assert engine_metrics([None], [None], 1.0) == {}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_k0_is_the_synchronous_loop_byte_for_byte(tool_caller, tmp_path):
    """The asynchronous loop at max_staleness 0 against the plain synchronous one (rollouts, then
    the update, step by step), with a batching engine, several turns and real tool calls: the same
    tokens, tool outputs and weights, to the byte."""
    rows = [{"problem": f"What is {a} * {b}?", "answer": str(a * b)} for a in (2, 3, 4) for b in (5, 6)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def config(out):
        tree = rl_config(tool_caller, tmp_path / "train.jsonl", tmp_path / out)
        del tree["reward"]  # the verifier on the tool-computed answers
        tree["run"].update(steps=3, save_every=3, batch_size=2)
        tree["rollout"].update(max_turns=3, max_response_tokens=96, engine={"max_batch_size": 8}, samples=4)
        tree["roc"] = {"keep": 2}
        return parse_config(tree)

    _train(config("k0"))
    _train(config("sync"), trainer=LockstepTrainer)
    a, b = latest_checkpoint(tmp_path / "k0"), latest_checkpoint(tmp_path / "sync")
    assert a.name == b.name == "step-000003"
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    calls = turns = 0
    for step in (1, 2, 3):
        name = f"step_{step:06d}.jsonl"
        ta, tb = (
            [json.loads(x) for x in (tmp_path / run / "samples" / name).read_text().splitlines()]
            for run in ("k0", "sync")
        )
        assert [t["response_ids"] for t in ta] == [t["response_ids"] for t in tb], step
        assert [len(t["turns"]) for t in ta] == [len(t["turns"]) for t in tb]
        calls += sum(len(turn["calls"]) for t in ta for turn in t["turns"])
        turns = max([turns] + [len(t["turns"]) for t in ta])
    assert calls > 0  # the tool ran (its outputs are in the compared ids)
    assert turns > 1  # a turn after a tool response
    # the engine decoded rows together (occupancy: the share of its 8 rows a decode step held)
    assert max(r["engine/occupancy"] for r in read_metrics(tmp_path / "k0" / "metrics.jsonl")) > 1 / 8


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_k1_trains_tokens_at_most_one_update_old_and_records_their_versions(tiny_dir, data):
    cfg = _config(tiny_dir, data, "k1", steps=4, max_staleness=1)
    history = _train(cfg)
    assert len(history) == 4
    rows = read_metrics(data / "k1" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["staleness/max"] <= 1 for r in rows)
    assert all("update/tis_mean" in r for r in rows if "loss" in r)
    # the engine's copy is compared exactly with the weights sent after every update (a difference
    # stops the run, see below), with no probe in its batch
    assert all("sync/logprob_diff" not in r for r in rows)
    # step 2's groups were started with step 1's, before its update (they generated during it)
    second = (data / "k1" / "samples" / "step_000002.jsonl").read_text().splitlines()
    assert {json.loads(x)["meta"]["admitted_version"] for x in second} == {0}
    # every trained model token carries the version that sampled it; none is older than k
    assert_versions_in_bound(data / "k1", k=1)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_engine_threads_split_the_cores_while_the_update_runs_beside_the_engine(tiny_dir, data, monkeypatch):
    """asynchronous.engine_threads at k = 1 in-process: while an update runs, its thread uses the rest
    of model.threads and the engine's thread engine_threads; each goes back to all of them after."""
    import threading

    calls = []
    real = torch.set_num_threads

    def spy(n):
        calls.append((threading.current_thread().name, n))
        real(n)

    monkeypatch.setattr(torch, "set_num_threads", spy)
    cfg = _config(tiny_dir, data, "split", steps=3, max_staleness=1, engine_threads=1)
    cfg.model.threads = 3
    _train(cfg)
    engine = [n for name, n in calls if name.startswith("engine-")]
    update = [n for name, n in calls if not name.startswith(("engine-", "MainThread"))]
    assert update == [2, 3] * 3  # each update: 2 of the 3 threads, then all 3 again
    # the engine decoding during an update: 1 thread, then 3 once the update is done
    assert engine and engine[: len(engine) // 2 * 2] == [1, 3] * (len(engine) // 2), calls
    # at k = 0 the engine never decodes beside the update: nothing is split
    calls.clear()
    _train(_config(tiny_dir, data, "nosplit", steps=2, engine_threads=1))
    assert [n for name, n in calls if name != "MainThread"] == []


async def test_a_generation_across_a_weight_update_records_both_versions(tiny):
    """A request decoding when the weights change is neither lost nor restarted: its rows are
    prefilled again under the new weights, and each token says which version sampled it."""
    import copy

    model, tok = copy.deepcopy(tiny[0]), tiny[1]  # its weights change here
    engine = HFEngine(model, max_batch_size=4)
    prompt = tok.encode("count: one two three", add_special_tokens=False)
    task = asyncio.create_task(engine.generate(prompt, SamplingParams(max_new_tokens=120, seed=1)))
    while engine.stats["steps"] < 10:
        await asyncio.sleep(0.001)
    changed = {k: v + 0.01 * torch.randn_like(v) for k, v in model.state_dict().items()}
    await asyncio.to_thread(engine.update_weights, changed, 7)
    g = await task
    await engine.close()
    assert len(g.versions) == len(g.token_ids) == 120
    first_new = g.versions.index(7)
    assert first_new >= 10 and set(g.versions[:first_new]) == {0} and set(g.versions[first_new:]) == {7}
    assert engine.stats["reprefills"] == 1


class _HeldTool:
    """The real code environment, whose answers are held until the test lets them go."""

    def __init__(self, pool):
        self.pool, self.called, self.release = pool, asyncio.Event(), asyncio.Event()

    async def run(self, request):
        result = await self.pool.run(request)
        self.called.set()
        await self.release.wait()
        return result


class _CallsFirst:
    """The real engine, but its first answer is a tool call written for the model: a few SFT steps
    of a tiny model write other code, or none, on other CPUs, and this test is about what happens
    around a call, not whether one is written. Every later turn is the engine's own."""

    def __init__(self, engine, call_ids):
        self.engine, self.call_ids, self.first = engine, list(call_ids), True

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def generate(self, prompt_ids, params):
        from rstar2.engines.base import Generation

        if self.first:
            self.first = False
            n = len(self.call_ids)
            return Generation(list(self.call_ids), [0.0] * n, "stop", [self.engine.version] * n)
        return await self.engine.generate(prompt_ids, params)


async def test_a_tool_call_in_flight_across_an_update_completes_and_the_trajectory_goes_on(
    tiny, pool, verifier
):
    """A trajectory waiting on its tool when the weights change is neither lost nor restarted: the
    tool's result is appended and the next turn is sampled by the new version."""
    import copy

    from rstar2.chat.format import ChatFormat
    from rstar2.config import RolloutSection
    from rstar2.rollout import Rollout
    from tests.rl.test_sft import CALL

    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    fmt = ChatFormat(tok, system_prompt="Answer.", tools_in_prompt=False)
    engine = HFEngine(model, max_batch_size=4)
    call_ids = tok.encode(CALL.replace("6*7", "4*5") + "<|im_end|>", add_special_tokens=False)
    tool = _HeldTool(pool)
    settings = RolloutSection(max_turns=4, max_response_tokens=200, top_k=1)
    rollout = Rollout(_CallsFirst(engine, call_ids), fmt, tool, verifier, settings)
    task = asyncio.create_task(rollout.run("What is 4 * 5?", "20", seed=0))
    await asyncio.wait_for(tool.called.wait(), 120)
    same = {k: v.clone() for k, v in model.state_dict().items()}  # new weights (here equal in value)
    await asyncio.to_thread(engine.update_weights, same, 3)
    tool.release.set()
    t = await asyncio.wait_for(task, 120)
    await engine.close()
    held = next(i for i, turn in enumerate(t.turns) if any(c.result is not None for c in turn.calls))
    call = next(c for c in t.turns[held].calls if c.result is not None)
    assert len(t.turns) > held + 1, "the trajectory did not go on after the update"
    spans, at = [], 0
    for turn in t.turns:  # (model tokens, tool tokens) of each turn, in the response
        spans.append(
            (
                t.versions[at : at + turn.model_tokens],
                t.versions[at + turn.model_tokens : at + turn.model_tokens + turn.tool_tokens],
            )
        )
        at += turn.model_tokens + turn.tool_tokens
    assert all(set(model) == {0} for model, _ in spans[: held + 1])  # sampled before the update
    assert all(set(model) == {3} for model, _ in spans[held + 1 :])  # after it: the new version
    assert all(set(tool) <= {-1} for _, tool in spans)
    # the held call's result is what the next turn read: its response in the tool tokens of that turn
    start = sum(turn.model_tokens + turn.tool_tokens for turn in t.turns[:held]) + t.turns[held].model_tokens
    tool_text = fmt.decode(t.response_ids[start : start + t.turns[held].tool_tokens])
    assert call.result.status == "ok" and call.response == "20" and call.response in tool_text


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_asynchronous_run_killed_resumes_from_its_checkpoint_and_trains_each_step_once(tiny_dir, data):
    """kill -9 while groups of later steps are in flight: the resumed run regenerates them from the
    checkpoint's data position; every step is trained exactly once and the run ends."""
    import yaml

    from tests.rl.test_trainer import train_until_killed

    out = data / "killed"
    tree = rl_config(tiny_dir, data / "train.jsonl", out)
    tree["run"].update(steps=6, save_every=2)
    tree["rollout"]["top_k"] = 0
    tree["asynchronous"] = {"max_staleness": 2}
    tree["loss"] = {"tis_cap": 2.0}
    (data / "killed.yaml").write_text(yaml.safe_dump(tree))
    train_until_killed(data / "killed.yaml", out)
    saved = latest_checkpoint(out)
    assert saved.name in ("step-000002", "step-000004")
    position = json.loads((saved / "state.json").read_text())["data_position"]
    assert position == int(saved.name.split("-")[1]) * 4  # the trained steps' problems, not the feed's
    resumed = _train(parse_config(tree), resume=True)
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]  # each step once
    assert len(resumed) == 6 - int(saved.name.split("-")[1])
    assert all(r["staleness/max"] <= 2 for r in rows)
    assert latest_checkpoint(out).name == "step-000006"


async def test_keep_stale_kv_keeps_the_running_rows_kv_but_no_kept_prefix_across_an_update(tiny):
    """``asynchronous.keep_stale_kv``: the running row is not prefilled again (its KV is as old as its
    admission, which the trainer's bound covers), but the kept prefixes are dropped: a request
    admitted after the update (another group, perhaps many versions on) never reads KV computed
    under old weights."""
    import copy

    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    engine = HFEngine(model, max_batch_size=4, keep_stale_kv=True)
    prompt = tok.encode("count: one two three", add_special_tokens=False)
    first = await engine.generate(prompt, SamplingParams(max_new_tokens=8, seed=2))
    assert len(engine.store) == 1  # the first turn's KV, kept for its next turn
    task = asyncio.create_task(engine.generate(prompt[:5], SamplingParams(max_new_tokens=120, seed=1)))
    while engine.stats["steps"] < 20:
        await asyncio.sleep(0.001)
    changed = {k: v + 0.01 * torch.randn_like(v) for k, v in model.state_dict().items()}
    await asyncio.to_thread(engine.update_weights, changed, 7)
    g = await task
    reused = engine.stats["reused_tokens"]
    nxt = await engine.generate(prompt + first.token_ids + [3], SamplingParams(max_new_tokens=4, seed=3))
    await engine.close()
    assert engine.stats["reprefills"] == 0  # the running row kept its KV
    assert engine.stats["reused_tokens"] == reused  # the next turn prefilled from scratch
    first_new = g.versions.index(7)
    assert set(g.versions[:first_new]) == {0} and set(g.versions[first_new:]) == {7}
    assert nxt.versions == [7] * len(nxt.token_ids)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_engine_copy_that_holds_other_weights_stops_the_run_at_once(tiny_dir, data, monkeypatch):
    """At k = 1 the engine decodes from its own copy of the weights; a copy that did not take what
    was sent (here: loaded as something else) stops the run at once, before any rollout samples
    from it: at the start, where the run's own weights are sent first."""
    from rstar2.engines.hf import HFEngine
    from rstar2.rl.run.checkpoint import latest_checkpoint
    from rstar2.rl.trainer import RunError

    real = HFEngine.update_weights

    def wrong(self, state_dict, version=None):  # the load "succeeds" with other weights
        real(self, {k: v * 0.5 for k, v in state_dict.items()}, version)

    monkeypatch.setattr(HFEngine, "update_weights", wrong)
    cfg = _config(tiny_dir, data, "wrong", steps=3, max_staleness=1)
    cfg.run.save_every = 1
    with pytest.raises(
        RunError,
        match=r"RL start.*WeightSyncError.*rank0 holds other weights than the trainer sent as version 0",
    ):
        _train(cfg)
    assert not (data / "wrong" / "metrics.jsonl").exists() or not read_metrics(
        data / "wrong" / "metrics.jsonl"
    )
    assert latest_checkpoint(data / "wrong") is None


def test_the_held_weights_are_compared_exactly_and_a_skipped_name_counts(tiny):
    """``load_state_dict(strict=False)`` skips a name it does not know without a word: the check
    sees it, as it sees a tensor that differs."""
    import copy

    from rstar2.engines.hf import HFEngine

    engine = HFEngine(copy.deepcopy(tiny[0]))
    sent = {k: v.clone() for k, v in tiny[0].state_dict().items()}
    assert engine.held_difference(sent) == 0.0
    name = next(iter(sent))
    assert engine.held_difference({**sent, name: sent[name] + 0.25}) == pytest.approx(0.25)
    assert engine.held_difference({**sent, "model." + name: sent[name]}) == float("inf")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_banned_tokens_are_left_out_by_the_trainer_as_by_the_engine(tiny_dir, data, tiny):
    """The engine samples with a third of the vocabulary banned (renormalised without it); every
    trainer pass leaves the same ids out, so at k = 0 the trainer's log-probs are the engine's:
    ``update/engine_gap`` ~0 (with the whole vocabulary it is the log of the banned mass)."""
    tok = tiny[1]
    specials = set(tok.all_special_tokens)
    ordinary = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1]) if t not in specials]
    banned = ordinary[100:270]
    _train(_config(tiny_dir, data, "banned", steps=2, banned_tokens=banned))
    rows = read_metrics(data / "banned" / "metrics.jsonl")
    gaps = [r["update/engine_gap"] for r in rows if "update/engine_gap" in r]
    assert gaps and max(gaps) < 1e-4, gaps
    ids = set(tok.convert_tokens_to_ids(banned))
    for line in (data / "banned" / "samples" / "step_000001.jsonl").read_text().splitlines():
        t = json.loads(line)
        assert not ids & {i for i, m in zip(t["response_ids"], t["loss_mask"], strict=True) if m}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_step_with_tokens_of_another_version_is_refused_before_it_trains(tiny_dir, data, monkeypatch):
    """An engine whose tokens say a version the trainer is not at (here: one ahead, as a server
    holding a later run's weights would) stops the run at its first step, naming the engine;
    nothing is trained, logged or saved."""
    from rstar2.rl.trainer import RunError

    real = HFEngine._new_weights
    monkeypatch.setattr(HFEngine, "_new_weights", lambda self, version: real(self, version + 1))
    with pytest.raises(
        RunError, match=r"RL step 1.*StalenessError: engine rank0 .*version 1, outside \[0, 0\]"
    ):
        _train(_config(tiny_dir, data, "ahead", steps=2))
    assert latest_checkpoint(data / "ahead") is None
    assert not (data / "ahead" / "metrics.jsonl").exists() or not read_metrics(
        data / "ahead" / "metrics.jsonl"
    )


async def test_new_weights_are_written_off_the_event_loop(tiny, tmp_path, monkeypatch):
    """Publishing to an engine copy (an asynchronous run) leaves the event loop free: rollouts and
    tool calls of the next steps go on while the weights are written and checked."""
    import copy

    from rstar2.config import EngineSection
    from rstar2.rl.run import distributed as D
    from rstar2.rl.run.sync import publish

    model = tiny[0]
    engine = HFEngine(copy.deepcopy(model))
    real = HFEngine.update_weights

    def slow(self, state_dict, version):
        time.sleep(0.5)
        real(self, state_dict, version)

    monkeypatch.setattr(HFEngine, "update_weights", slow)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    beside = asyncio.create_task(ticker())
    await publish(
        model,
        [engine],
        EngineSection(),
        D.World(),
        tmp_path,
        in_place=False,
        probe_prompt=[1, 2],
        pad_id=0,
        step=3,
    )
    beside.cancel()
    await engine.close()
    assert engine.version == 3 and ticks >= 20, ticks
