"""Multi-turn tool-integrated rollouts: generate → parse → execute → append → repeat, one code path
for training and evaluation. Token-in, token-out: the engine's sampled ids are kept as they are and
only each new tool turn is tokenized (``ChatFormat``), with loss mask 0."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from ..chat.format import ChatFormat, end_of_turn_ids
from ..chat.tags import ANSWER_OPEN
from ..chat.tools import SESSION_TOOL, ParsedTurn, ToolCall, parse_tool_calls
from ..config import RolloutSection
from ..engines.base import Engine, Generation, SamplingParams, UnversionedTokens
from ..sandbox.request import ExecRequest
from ..sandbox.result import ExecResult
from .scheduler import NoEngineError, Request, Scheduler
from .trajectory import FinishReason, ToolCallRecord, Trajectory, Turn

Event = Callable[[str, dict[str, Any]], None]
TURNS_SPAN = 1000  # request priority = trajectory priority x this - turn: a next turn before new ones
# Verdicts the verifier's service caused, not the answer: its workers could not run the check
# ("error"), or the machine starved it past its wall-clock backstop ("stalled").
VERIFIER_FAULT_PATHS = ("error", "stalled")
# A custom reward (``reward:`` in a config): the trajectory's reward, in the verifier's place.
RewardFn = Callable[[Trajectory], float]
REWARD_THREADS = 8  # custom rewards computed at once, each in a thread (``Rollout._custom_reward``)


class CodeEnvironment(Protocol):
    """Where tool calls run: the local sandbox pool, the HTTP client, or the Redis backend."""

    async def run(self, code: str | ExecRequest, input: str = "", **kw: Any) -> ExecResult: ...


class Verifier(Protocol):
    """``options``: ``mode`` (strict or lenient), and ``gym`` for a problem drawn from reasoning-gym
    (``rstar2.gym``: its task's own scorer may decide)."""

    async def acheck(self, reference: str, response: str, **options: Any) -> Any: ...


def token_ids(tokenizer: Any, tokens: Sequence[str] | None, key: str) -> tuple[int, ...]:
    """Token strings of a setting (``banned_tokens``, ``stop_tokens``) as ids; unknown ones are an error."""
    vocab = tokenizer.get_vocab()
    unknown = [t for t in tokens or () if t not in vocab]
    if unknown:
        raise ValueError(f"{key}: not in the tokenizer's vocabulary: {unknown}")
    return tuple(vocab[t] for t in tokens or ())


@dataclass
class _Live:
    """A trajectory being rolled out, and what each of its turns needs."""

    traj: Trajectory
    key: str  # its id: the scheduler's, and the session tool's session
    seed: int | None
    priority: int
    emit: Event
    engine: Engine | None = None  # the engine that served its last request (its prefix is there)


def known_versions(gen: Generation) -> list[int]:
    """The policy version of each sampled token, -1 where the engine did not say."""
    return list(gen.versions) if gen.versions is not None else [-1] * len(gen.token_ids)


class Rollout:
    def __init__(
        self,
        engines: Engine | Sequence[Engine],
        fmt: ChatFormat,
        code_env: CodeEnvironment,
        verifier: Verifier | None = None,
        config: RolloutSection | None = None,
        *,
        reward: RewardFn | None = None,
    ) -> None:
        """``config``'s chat fields are ``fmt``'s business; its engine and sandbox ``open_rollout``'s.
        ``reward``: a custom reward (the RL trainer's ``reward:``) scoring every trajectory in the
        verifier's place, given here so that no rollout ever starts before its reward is known."""
        engines = [engines] if not isinstance(engines, Sequence) else list(engines)
        self.fmt = fmt
        self.code_env = code_env
        self.verifier = verifier
        self.config = config or RolloutSection()
        self.scheduler = Scheduler(
            engines,
            self.config.scheduler.policy,
            grant_tokens=self.config.scheduler.grant_tokens,
            revive_for_s=self.config.scheduler.revive_for_s,
        )
        self.stop_ids = token_ids(fmt.tokenizer, self.config.stop_tokens, "rollout.stop_tokens") or (
            end_of_turn_ids(fmt.tokenizer)
        )
        self.banned_ids = token_ids(fmt.tokenizer, self.config.banned_tokens, "rollout.banned_tokens")
        # the rendered prompt, once per problem: its 2G samples (or K eval samples) share it
        self._prompt_ids = functools.lru_cache(maxsize=4096)(fmt.prompt_ids)
        # the RL trainer's: a token whose version the engine does not report is a failure of that engine
        self.require_versions = False
        self.reward = reward
        self._reward_threads: ThreadPoolExecutor | None = None  # made at the first custom reward

    async def run(
        self,
        problem: str,
        reference: str | None = None,
        *,
        seed: int | None = None,
        meta: dict[str, Any] | None = None,
        on_event: Event | None = None,
        priority: int = 0,
        gym: dict[str, Any] | None = None,
    ) -> Trajectory:
        """One trajectory. ``priority``: its requests' place in an engine's queue when rows are short
        (lower first); ``gym``: a reasoning-gym problem's scorer inputs, passed to the verifier."""
        started = time.perf_counter()
        traj = Trajectory(problem, reference, list(self._prompt_ids(problem)), meta=dict(meta or {}))
        key = traj.meta.setdefault("id", uuid.uuid4().hex[:16])
        live = _Live(traj, key, seed, priority, on_event or (lambda kind, data: None))
        self.scheduler.open(key)
        try:
            traj.finish_reason = await self._turns(live)
        except Exception as exc:  # an engine failure ends this trajectory, never the batch
            traj.finish_reason = "error"
            traj.verdict = f"rollout error: {type(exc).__name__}: {exc}"
            # its engine failed every retry (not a request refused, or too large for any engine)
            traj.meta["engine_lost"] = not isinstance(exc, ValueError | NoEngineError)
        finally:
            self.scheduler.close(key)
        t_reward = time.perf_counter()
        await self._score(traj, gym)
        traj.meta["reward_s"] = time.perf_counter() - t_reward
        if traj.finish_reason == "error":
            traj.fault = "engine"
        elif traj.num_faulted_calls:
            traj.fault = "sandbox"
        traj.seconds = time.perf_counter() - started
        live.emit("done", {"trajectory": traj})
        return traj

    async def _turns(self, live: _Live) -> FinishReason:
        """Turn after turn until the model answers or calls no tool, or a limit is reached: why it ended."""
        cfg, traj = self.config, live.traj
        for turn_no in range(cfg.max_turns):
            left = cfg.max_response_tokens - len(traj.response_ids)
            if left <= 0:
                return "max_length"
            gen, turn = await self._model_turn(live, turn_no, min(left, cfg.max_tokens_per_turn or left))
            if gen.finish_reason == "length":
                return "max_length"
            if ANSWER_OPEN in turn.text:
                return "answer"
            parsed = parse_tool_calls(turn.text, tools=self.fmt.tool_names, max_calls=cfg.max_calls_per_turn)
            if not parsed.calls:
                return "no_tool_call"
            if not await self._tool_turn(live, turn_no, turn, parsed, gen.token_ids):
                return "max_length"  # no room left for the tool turn and a reply
        return "max_turns"

    async def _model_turn(self, live: _Live, turn_no: int, budget: int) -> tuple[Generation, Turn]:
        """The model's turn, appended with loss mask 1, the engine's log-probs and versions."""
        t0 = time.perf_counter()
        gen = await self._generate_turn(live, turn_no, budget)
        ids = list(gen.token_ids)
        text = self.fmt.decode([i for i in ids if i not in self.stop_ids])
        turn = Turn(text, len(ids), gen_s=time.perf_counter() - t0, engine=live.engine.name)
        traj = live.traj
        traj.turns.append(turn)
        traj.response_ids += ids
        traj.loss_mask += [1] * len(ids)
        traj.logprobs += list(gen.logprobs)
        traj.versions += gen.versions or []  # one a token (-1 where unknown): _generate_turn's
        live.emit("generation", {"turn": turn_no, "text": text})
        return gen, turn

    async def _tool_turn(
        self, live: _Live, turn_no: int, turn: Turn, parsed: ParsedTurn, model_ids: list[int]
    ) -> bool:
        """The turn's calls run together, and what the model reads back appended with loss mask 0;
        False when that leaves no room for a reply (nothing appended)."""
        cfg, traj = self.config, live.traj
        t1 = time.perf_counter()
        turn.calls = await asyncio.gather(*(self._call(c, live.key) for c in parsed.calls))
        turn.skipped_calls = parsed.skipped
        turn.tool_s = time.perf_counter() - t1
        for call in turn.calls:
            live.emit("tool", {"turn": turn_no, "call": call})
        responses = [c.response for c in turn.calls]
        if parsed.skipped:
            responses[-1] += (
                f"\n({parsed.skipped} more tool call(s) in this turn were not run: "
                f"at most {cfg.max_calls_per_turn} per turn.)"
            )
        end = self.fmt.decode(model_ids[-1:]) if model_ids and model_ids[-1] in self.stop_ids else ""
        tool_ids = self.fmt.tool_turn_ids(responses, model_end=end)
        if len(traj.response_ids) + len(tool_ids) >= cfg.max_response_tokens:
            return False
        turn.tool_tokens = len(tool_ids)
        traj.response_ids += tool_ids
        traj.loss_mask += [0] * len(tool_ids)
        traj.logprobs += [0.0] * len(tool_ids)
        traj.versions += [-1] * len(tool_ids)
        return True

    async def _generate_turn(self, live: _Live, turn_no: int, budget: int) -> Generation:
        """One model turn of up to ``budget`` tokens, in as many requests as the scheduler's grants need;
        ``live.engine`` becomes the engine that served. A failed engine is taken out of rotation and
        the request retried on another; a bad request (``ValueError``) is not retried."""
        cfg, traj = self.config, live.traj
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        failures = piece = 0
        while True:
            context = traj.prompt_ids + traj.response_ids + ids
            request = Request(live.key, len(context), budget - len(ids), live.engine, turn_no)
            used = await self.scheduler.acquire(request)
            grant = request.granted or request.max_new_tokens
            params = SamplingParams(  # a seed for each piece of each turn; a later turn ahead in line
                max_new_tokens=grant,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                top_k=cfg.top_k,
                stop_token_ids=self.stop_ids,
                banned_token_ids=self.banned_ids,
                seed=None if live.seed is None else live.seed * 1000 + turn_no + 1_000_003 * piece,
                priority=live.priority * TURNS_SPAN - min(turn_no, TURNS_SPAN - 1),
            )
            try:
                gen = await used.generate(context, params)
                if self.require_versions and any(v < 0 for v in known_versions(gen)):
                    raise UnversionedTokens(
                        f"engine {used.name} did not say which policy version sampled its tokens "
                        "(restarted, or a weight load failed): it serves again once it holds the current weights"
                    )
            except ValueError:
                raise
            except Exception as exc:
                failures += 1  # the engine is out of rotation either way
                retry = self.scheduler.fail(used, f"{type(exc).__name__}: {exc}")
                if failures > cfg.scheduler.retries or not retry:
                    raise
                live.engine = None  # the turn goes on elsewhere
                continue
            finally:
                self.scheduler.release(used, request)
            live.engine = used
            ids += gen.token_ids
            logprobs += gen.logprobs
            versions += known_versions(gen)
            piece += 1
            cut_short = gen.finish_reason == "length" and len(gen.token_ids) < grant  # model's positions
            if gen.finish_reason == "stop" or len(ids) >= budget or cut_short:
                return Generation(ids, logprobs, gen.finish_reason, versions)

    async def _call(self, call: Any, key: str) -> ToolCallRecord:
        if not isinstance(call, ToolCall):
            text, cut = self.fmt.tool_response(call)
            return ToolCallRecord(call.name, {}, text, None, call.message, cut)
        req = ExecRequest(
            code=call.arguments.get("code", ""),
            input=call.arguments.get("input", ""),
            timeout_s=self.config.tool_timeout_s,
            session_id=key if call.name == SESSION_TOOL else None,
        )
        try:
            result = await self.code_env.run(req)
        except Exception as exc:  # the environment failed, not the model's code
            result = ExecResult.failure("internal", f"code environment unavailable: {exc}")
        text, cut = self.fmt.tool_response(result)
        return ToolCallRecord(call.name, call.arguments, text, result, cut=cut)

    async def _score(self, traj: Trajectory, gym: dict[str, Any] | None) -> None:
        if self.reward is not None:  # a config's own reward (``reward:``): it sees every rollout
            traj.reward = float(await self._custom_reward(traj))
            return
        if traj.reference is None or self.verifier is None or traj.finish_reason in ("max_length", "error"):
            return  # a truncated trajectory keeps reward 0
        options: dict[str, Any] = {"mode": self.config.verify_mode} | ({"gym": gym} if gym else {})
        try:
            verdict = await self.verifier.acheck(traj.reference, traj.model_text, **options)
        except Exception as exc:
            traj.verdict, traj.fault = f"verifier error: {type(exc).__name__}: {exc}", "verifier"
            return
        if getattr(verdict, "path", None) in VERIFIER_FAULT_PATHS:
            traj.verdict, traj.fault = f"verifier fault: {verdict.reason}", "verifier"
            return
        traj.reward = 1.0 if verdict else 0.0
        traj.answer = getattr(verdict, "answer", None)
        traj.verdict = getattr(verdict, "reason", "")

    async def _custom_reward(self, traj: Trajectory) -> Any:
        """The custom reward of a finished trajectory, in one of the rollout's own threads (up to
        ``REWARD_THREADS`` at once: it must be thread-safe): on the event loop a slow one would stall
        every rollout in flight, and asyncio's default threads are the update's and checkpoints'. What
        it raises fails ``run``: a broken reward is the config's error, not a fault to absorb."""
        if self._reward_threads is None:
            self._reward_threads = ThreadPoolExecutor(REWARD_THREADS, thread_name_prefix="rstar2-reward")
        return await asyncio.get_running_loop().run_in_executor(self._reward_threads, self.reward, traj)

    def close(self) -> None:
        """Let the custom reward's threads go; a reward still running finishes in its thread, unawaited."""
        if self._reward_threads is not None:
            self._reward_threads.shutdown(wait=False, cancel_futures=True)
            self._reward_threads = None

    async def run_many(
        self, items: Sequence[dict[str, Any]], *, on_done: Callable[[Trajectory], None] | None = None
    ) -> list[Trajectory]:
        """Items: dicts of ``problem``, ``answer``, ``seed``, …; results in order, each to ``on_done``."""

        async def one(item: dict[str, Any]) -> Trajectory:
            traj = await self.run(
                item["problem"],
                item.get("answer"),
                seed=item.get("seed"),
                meta=item.get("meta"),
                priority=item.get("priority", 0),
                gym=item.get("gym"),
            )
            if on_done is not None:
                on_done(traj)
            return traj

        return list(await asyncio.gather(*(one(it) for it in items)))
