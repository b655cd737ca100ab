"""No token of unknown origin trains (issue 26): an engine must say which policy version sampled each
token, or at least which one it holds before and after a request; a token without one fails its
engine, which serves again only once it holds the current weights; an engine that never comes back
stops the turns waiting for it, and the trainer's step with them."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from rstar2.config import RolloutSection, SchedulerSection
from rstar2.engines.base import Generation, SamplingParams
from rstar2.engines.openai import OpenAIEngine
from rstar2.rl.algorithm.staleness import StalenessError, check_versions
from rstar2.rl.run import distributed as D
from rstar2.rl.run.engine_mode import require_reported_versions
from rstar2.rl.trainer import check_faults
from rstar2.rollout import Rollout, Trajectory
from rstar2.rollout.trajectory import Turn

from ..conftest import trained_tokens_out_of_bound
from .conftest import ScriptedEngine
from .test_rollout import SCRIPTS


class Versioned(ScriptedEngine):
    """The scripted engine, saying that policy ``version`` sampled its tokens; None: it says nothing
    (a plain OpenAI-compatible server, or one restarted before the trainer loaded weights into it)."""

    def __init__(self, chatml, tiny, name: str, version: int | None, capacity: int = 1 << 20):
        super().__init__(
            chatml, SCRIPTS, tiny[1].convert_tokens_to_ids("<|im_end|>"), "<|im_start|>assistant"
        )
        self.name, self.version, self.capacity_tokens = name, version, capacity
        self.version_source = "tokens"
        self.calls = 0

    async def generate(self, prompt_ids, params):
        self.calls += 1
        gen = await super().generate(prompt_ids, params)
        gen.versions = None if self.version is None else [self.version] * len(gen.token_ids)
        return gen


def model_versions(traj: Trajectory) -> list[int]:
    return [v for v, m in zip(traj.versions, traj.loss_mask, strict=True) if m]


async def test_tokens_without_a_reported_version_fail_their_engine_and_go_on_elsewhere(
    chatml, tiny, pool, verifier
):
    silent = Versioned(chatml, tiny, "silent", None, capacity=1 << 22)  # the roomiest: asked first
    versioned = Versioned(chatml, tiny, "versioned", 3)
    rollout = Rollout([silent, versioned], chatml, pool, verifier, RolloutSection(max_turns=3))
    rollout.require_versions = True
    trajs = await rollout.run_many([{"problem": "answers", "answer": "4"}] * 4)
    assert silent.calls >= 1  # it was asked, and what it sampled was thrown away
    assert all(t.finish_reason == "answer" and t.fault is None for t in trajs)
    assert {turn.engine for t in trajs for turn in t.turns} == {"versioned"}
    assert all(set(model_versions(t)) == {3} for t in trajs)
    assert rollout.scheduler.policy.alive == [False, True]

    # an evaluation asks for no version: the same engine serves it, its tokens marked unknown
    evaluation = Rollout([Versioned(chatml, tiny, "silent", None)], chatml, pool, verifier)
    traj = await evaluation.run("answers", "4")
    assert traj.finish_reason == "answer" and set(model_versions(traj)) == {-1}


async def test_a_failed_engine_serves_again_only_once_revive_has_loaded_the_current_weights(
    chatml, tiny, pool, verifier
):
    """One engine, restarted: it says no version until the trainer's ``revive`` loads weights into
    it; the turn waits for that (the engine is the last one, and is still taken out) and goes on."""
    restarted = Versioned(chatml, tiny, "restarted", None)
    rollout = Rollout(restarted, chatml, pool, verifier, RolloutSection(max_turns=3))
    rollout.require_versions = True
    revived = []

    async def revive(engine):
        revived.append(engine.name)
        engine.version = 7  # the current weights, loaded and checked

    rollout.scheduler.revive = revive
    traj = await rollout.run("answers", "4")
    assert revived == ["restarted"]
    assert traj.finish_reason == "answer" and traj.fault is None
    assert set(model_versions(traj)) == {7}  # nothing it sampled before the load was kept


async def test_engines_that_never_come_back_stop_the_turns_that_wait_for_them_naming_each(
    chatml, tiny, pool, verifier
):
    gone = [Versioned(chatml, tiny, name, None) for name in ("gone-a", "gone-b")]
    settings = RolloutSection(max_turns=3, scheduler=SchedulerSection(revive_for_s=0.5))
    rollout = Rollout(gone, chatml, pool, verifier, settings)
    rollout.require_versions = True

    async def revive(engine):
        raise ConnectionError(f"{engine.name}: connection refused")

    rollout.scheduler.revive = revive
    traj = await rollout.run("answers", "4")
    assert traj.fault == "engine" and "none came back" in traj.verdict
    assert "gone-a (ConnectionError: gone-a: connection refused)" in traj.verdict, traj.verdict
    assert "gone-b (ConnectionError: gone-b: connection refused)" in traj.verdict, traj.verdict
    assert traj.meta["engine_lost"] and rollout.scheduler.down is not None


def test_a_step_with_a_rollout_that_lost_its_engine_is_not_trained():
    """Faults of the code environment are tolerated up to ``run.max_fault_share``; a rollout whose
    engine died is not: training on the survivors would favour the short ones."""
    trainer = SimpleNamespace(
        cfg=SimpleNamespace(run=SimpleNamespace(max_fault_share=0.5), rollout=RolloutSection()),
        world=D.World(),
    )
    fine = [Trajectory("p", "1", [1], [2], [1], [0.0]) for _ in range(7)]
    refused = Trajectory("p", "1", [1], [2], [1], [0.0])  # a request the server refused (4xx): a fault
    refused.fault, refused.verdict = "engine", "rollout error: RequestRefused: answered 400"
    refused.meta["engine_lost"] = False
    check_faults([*fine, refused], trainer.cfg, trainer.world)
    lost = Trajectory("p", "1", [1], [2], [1], [0.0])
    lost.fault, lost.verdict = "engine", "rollout error: EngineDown: every engine failed"
    lost.meta["engine_lost"] = True
    with pytest.raises(RuntimeError, match="1 of 8 rollouts lost their engine.*not trained.*EngineDown"):
        check_faults([*fine, lost], trainer.cfg, trainer.world)
    # every rollout refused alike (a prompt longer than the model): no step, whatever the share allowed
    trainer.cfg.run.max_fault_share = 1.0
    with pytest.raises(RuntimeError, match="2 of 2 rollouts failed.*RequestRefused"):
        check_faults([refused, refused], trainer.cfg, trainer.world)


def test_a_token_whose_version_was_not_reported_is_refused():
    traj = Trajectory("p", "1", [1], [5, 6, 7], [1, 1, 1], [0.0] * 3)
    traj.turns = [Turn("x", 3, engine="http://gpu3:8000")]
    traj.versions = [4, 4, 4]
    check_versions([traj], trained_by=4, max_staleness=0)
    traj.versions = [4, -1, 4]
    with pytest.raises(StalenessError, match="gpu3.*version -1.*did not report"):
        check_versions([traj], trained_by=4, max_staleness=0)


def test_an_engine_that_cannot_report_versions_is_refused_before_its_tokens_train():
    says_each, states, silent = (
        SimpleNamespace(name=n, version_source=s) for n, s in (("a", "tokens"), ("b", "stated"), ("c", None))
    )
    require_reported_versions([says_each, states], max_staleness=0)
    require_reported_versions([says_each], max_staleness=2)
    with pytest.raises(StalenessError, match="engine b states only the version it holds"):
        require_reported_versions([says_each, states], max_staleness=1)
    with pytest.raises(StalenessError, match="engine c does not say"):
        require_reported_versions([silent], max_staleness=0)


def weight_server(versions: list[str], has_route: bool = True):
    """An OpenAI-compatible server as SGLang answers: ``/get_weight_version`` says the next of
    ``versions`` each time it is asked; a completion returns three tokens."""
    asked = iter(versions)

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        if path == "/get_weight_version" and has_route:
            return httpx.Response(200, json={"weight_version": next(asked)})
        if path == "/v1/completions":
            logprobs = {"token_logprobs": [-0.1, -0.2, -0.3]}
            choice = {"token_ids": [5, 6, 7], "finish_reason": "stop", "logprobs": logprobs}
            return httpx.Response(200, json={"choices": [choice]})
        return httpx.Response(404, json={})

    engine = OpenAIEngine("http://sglang:30000")
    engine._client = httpx.AsyncClient(base_url=engine.base_url, transport=httpx.MockTransport(handler))
    return engine


async def test_a_server_that_states_its_version_has_it_checked_before_and_after_each_request():
    params = SamplingParams(max_new_tokens=3)
    steady = weight_server(["default", "4", "4"])
    await steady.probe_capacity()  # its route answers (before any load, with SGLang's "default")
    assert steady.version_source == "stated"
    assert (await steady.generate([1], params)).versions == [4, 4, 4]

    straddled = weight_server(["default", "4", "5"])  # a load between the two questions
    await straddled.probe_capacity()
    assert (await straddled.generate([1], params)).versions == [-1, -1, -1]

    unloaded = weight_server(["default", "default", "default"])
    await unloaded.probe_capacity()
    assert (await unloaded.generate([1], params)).versions == [-1, -1, -1]

    plain = weight_server([], has_route=False)
    await plain.probe_capacity()
    assert plain.version_source is None and (await plain.generate([1], params)).versions is None
    for e in (steady, straddled, unloaded, plain):
        await e.close()


def test_generations_without_versions_are_unknown_not_current():
    from rstar2.rollout.multi_turn import known_versions

    assert known_versions(Generation([1, 2], [0.0, 0.0], "stop")) == [-1, -1]
    assert known_versions(Generation([1, 2], [0.0, 0.0], "stop", [3, 4])) == [3, 4]


def test_the_suites_own_check_over_every_rl_run_finds_a_token_out_of_bound():
    """The session-wide check (``conftest.trained_tokens_out_of_bound``) is able to fail (on a run
    written outside the session's folder, which it checks at the end)."""
    with tempfile.TemporaryDirectory() as root:
        check_a_written_run(Path(root))


def check_a_written_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "samples").mkdir(parents=True)
    (run / "config.yaml").write_text("kind: rl\nasynchronous: {max_staleness: 1}\n")
    (run / "metrics.jsonl").write_text(
        json.dumps({"step": 2, "staleness/mean": 0.5, "staleness/max": 1}) + "\n"
    )

    def sample(versions, kept=True):
        return {"versions": versions, "loss_mask": [1, 1, 0], "meta": {"roc": {"kept": kept}}}

    rows = [sample([1, 0, -1]), sample([-1, -1, -1], kept=False)]
    (run / "samples" / "step_000002.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert trained_tokens_out_of_bound(tmp_path) == []
    rows.append(sample([1, -1, -1]))  # a trained token whose version nobody reported
    (run / "samples" / "step_000002.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 2, "staleness/max": 2}) + "\n")
    assert len(trained_tokens_out_of_bound(tmp_path)) == 2
