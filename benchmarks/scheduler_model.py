"""A discrete-event model of multi-turn rollouts on E inference engines, to compare scheduling
policies on the same workloads without GPUs.

Each engine does continuous batching with a KV cache of ``capacity`` tokens. One engine iteration
decodes one token for every running sequence and costs ``Cost.step_s`` (affine in the batch size
and in the tokens prefilled in that iteration). An engine starts a waiting sequence only when its
context fits the free cache (as vLLM and SGLang do), and when the running sequences outgrow the cache
it preempts the most recently started ones, which later recompute their whole context (vLLM's
recompute preemption): these are the *recomputed tokens*. A turn on the engine that ran the
trajectory's previous turn prefills only the new tokens (prefix cache); elsewhere, the whole context.
Between turns a trajectory waits on its tool call for a latency drawn from a log-normal.

The policies are the real ones of ``rstar2/rollout/scheduler.py``, driven through ``submit``/``admit``/
``release`` — what is simulated is the engines, the tool and the clock.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rstar2.rollout.scheduler import Policy, Request, make_policy


@dataclass
class Cost:
    """Seconds for one engine iteration: ``base_s + per_seq_s·batch + per_prefill_token_s·prefilled``."""

    base_s: float = 0.015
    per_seq_s: float = 0.0002
    per_prefill_token_s: float = 0.00002

    def step_s(self, batch: int, prefilled: int) -> float:
        return self.base_s + self.per_seq_s * batch + self.per_prefill_token_s * prefilled


@dataclass
class TurnShape:
    gen_tokens: int  # what the model would write this turn if the budget allows
    tool_s: float  # the tool call's latency after this turn
    tool_tokens: int  # the tool response appended to the context


@dataclass
class Shape:
    prompt_tokens: int
    budget: int  # max response tokens (model + tool), as ``max_response_tokens``
    turns: list[TurnShape]


@dataclass
class ToolLatency:
    """Log-normal through a median and a 99th percentile (as the sandbox benchmark reports them)."""

    median_s: float = 0.05
    p99_s: float = 1.0

    def draw(self, rng: random.Random) -> float:
        sigma = max(1e-6, (math.log(self.p99_s) - math.log(self.median_s)) / 2.326)
        return rng.lognormvariate(math.log(self.median_s), sigma)


def workload(
    n: int,
    *,
    seed: int = 0,
    budgets: Sequence[int] = (8192, 12288),
    max_turns: int = 10,
    median_turn_tokens: int = 300,
    turn_tokens_sigma: float = 1.1,
    tool: ToolLatency | None = None,
    prompt_tokens: tuple[int, int] = (100, 400),
    group: int = 1,
) -> list[Shape]:
    """Heavy-tailed trajectories like the paper's: 1–``max_turns`` turns (most short, a long tail),
    log-normal tokens per turn, a budget drawn from ``budgets``. ``group`` samples share a prompt."""
    rng = random.Random(seed)
    tool = tool or ToolLatency()
    shapes = []
    for i in range(n):
        if i % group == 0:
            prompt = rng.randint(*prompt_tokens)
            budget = rng.choice(list(budgets))
        turns = min(max_turns, 1 + int(rng.expovariate(1 / 2.0)))
        shapes.append(
            Shape(
                prompt,
                budget,
                [
                    TurnShape(
                        gen_tokens=max(
                            8, int(rng.lognormvariate(math.log(median_turn_tokens), turn_tokens_sigma))
                        ),
                        tool_s=tool.draw(rng),
                        tool_tokens=rng.randint(20, 200),
                    )
                    for _ in range(turns)
                ],
            )
        )
    return shapes


@dataclass(eq=False)
class _Seq:
    request: Request
    traj: int
    target: int  # tokens to generate this turn
    prefill: int  # tokens to prefill when it starts
    submitted: float
    generated: int = 0
    started: float | None = None
    order: int = 0
    running: bool = False

    @property
    def kv(self) -> int:
        return self.request.context_tokens + self.generated


@dataclass
class _Engine:
    capacity: int
    running: list[_Seq] = field(default_factory=list)
    waiting: deque[_Seq] = field(default_factory=deque)
    busy: bool = False
    busy_s: float = 0.0
    alive: bool = True

    def kv_used(self) -> int:
        return sum(s.kv for s in self.running)


@dataclass
class SimResult:
    policy: str
    trajectories: int
    finished: int
    makespan_s: float
    generated_tokens: int
    tokens_per_s: float
    busy_share: float
    evictions: int
    recomputed_tokens: int
    wait_mean_s: float
    wait_p95_s: float
    max_reserved_share: float  # the policy's reservations over capacity, at worst (≤ 1: never oversubscribed)
    max_kv_share: float  # the engines' actual cache use over capacity, at worst

    def row(self) -> dict[str, Any]:
        return dict(self.__dict__)


def simulate(
    shapes: Sequence[Shape],
    policy: str | Policy,
    *,
    engines: int = 4,
    capacity: int = 65536,
    cost: Cost | None = None,
    max_tokens_per_turn: int | None = None,
    kill: tuple[int, float] | None = None,
    **policy_options: Any,
) -> SimResult:
    """Run every trajectory of ``shapes`` to its end under ``policy``. A request granted fewer tokens
    than its turn needs goes on in a new request, as the runner does. ``kill=(engine, t)`` makes
    that engine stop answering at time ``t`` (its requests in flight are submitted again)."""
    cost = cost or Cost()
    pol = (
        policy if isinstance(policy, Policy) else make_policy(policy, [capacity] * engines, **policy_options)
    )
    eng = [_Engine(c) for c in pol.capacity]
    clock = 0.0
    events: list[tuple[float, int, str, Any]] = []
    tie = iter(range(1 << 62))

    def at(t: float, kind: str, data: Any) -> None:
        heapq.heappush(events, (t, next(tie), kind, data))

    response = [0] * len(shapes)  # response tokens so far (model + tool)
    turn_no = [0] * len(shapes)
    in_turn = [0] * len(shapes)  # tokens of the current turn generated in earlier chunks
    last_engine: list[int | None] = [None] * len(shapes)
    cached_upto = [0] * len(shapes)  # context tokens the last engine holds in its prefix cache
    seqs: dict[int, _Seq] = {}
    finished = generated = evictions = recomputed = 0
    waits: list[float] = []
    max_res = max_kv = 0.0
    start_order = iter(range(1 << 62))

    def submit_turn(i: int) -> None:
        shape = shapes[i]
        left = shape.budget - response[i]
        turn_left = max_tokens_per_turn - in_turn[i] if max_tokens_per_turn else left
        budget = min(left, turn_left)
        ctx = shape.prompt_tokens + response[i]
        req = pol.submit(Request(str(i), ctx, budget, previous=last_engine[i], turn=turn_no[i]))
        seqs[req.seq] = _Seq(req, i, 0, prefill=ctx, submitted=clock)

    def end(i: int) -> None:
        nonlocal finished
        finished += 1
        pol.close(str(i))

    def pump() -> None:
        nonlocal max_res
        for req, e in pol.admit():
            seq = seqs[req.seq]
            i = seq.traj
            seq.target = min(shapes[i].turns[turn_no[i]].gen_tokens - in_turn[i], req.granted)
            if last_engine[i] == e:
                seq.prefill = max(1, req.context_tokens - cached_upto[i])
            eng[e].waiting.append(seq)
            max_res = max(max_res, pol.reserved[e] / pol.capacity[e])
        if pol.rejected:
            raise RuntimeError(pol.rejected[0][1])
        for e in range(len(eng)):
            kick(e)

    def kick(e: int) -> None:
        engine = eng[e]
        if engine.busy or not engine.alive:
            return
        prefilled = 0
        while engine.waiting and engine.kv_used() + engine.waiting[0].kv + 1 <= engine.capacity:
            seq = engine.waiting.popleft()
            seq.order = next(start_order)
            if seq.started is None:
                seq.started = clock
                waits.append(clock - seq.submitted)
            prefilled += seq.prefill
            seq.running = True
            engine.running.append(seq)
        if not engine.running:
            return
        nonlocal evictions, recomputed, max_kv
        # every running sequence grows by one token: preempt the newest until that fits
        while engine.kv_used() + len(engine.running) > engine.capacity and len(engine.running) > 1:
            victim = max(engine.running, key=lambda s: s.order)
            engine.running.remove(victim)
            victim.running = False
            evictions += 1
            recomputed += victim.kv
            victim.prefill = victim.kv
            engine.waiting.appendleft(victim)
        max_kv = max(max_kv, (engine.kv_used() + len(engine.running)) / engine.capacity)
        step = cost.step_s(len(engine.running), prefilled)
        # without new prefill, run several identical iterations at once, up to the next event
        k = 1
        if prefilled == 0:
            k = min(s.target - s.generated for s in engine.running)
            head = (engine.capacity - engine.kv_used()) // len(engine.running)
            k = max(1, min(k, head))
            if events:
                k = max(1, min(k, int((events[0][0] - clock) / step) + 1))
        engine.busy = True
        engine.busy_s += k * step
        at(clock + k * step, "step", (e, k, list(engine.running)))

    def step_done(e: int, k: int, batch: list[_Seq]) -> None:
        engine = eng[e]
        engine.busy = False
        if not engine.alive:
            return
        done = []
        for seq in batch:
            if not seq.running:
                continue
            seq.generated += k
            if seq.generated >= seq.target:
                seq.running = False
                done.append(seq)
        if done:
            engine.running = [s for s in engine.running if s.running]
        for seq in done:
            pol.release(e, seq.request)
            del seqs[seq.request.seq]
            turn_done(seq, e)

    def turn_done(seq: _Seq, e: int) -> None:
        nonlocal generated
        i = seq.traj
        generated += seq.generated
        response[i] += seq.generated
        last_engine[i] = e
        cached_upto[i] = seq.request.context_tokens + seq.generated
        shape = shapes[i]
        t = shape.turns[turn_no[i]]
        in_turn[i] += seq.generated
        if in_turn[i] < t.gen_tokens and seq.generated >= seq.request.granted:
            limits = [shape.budget - response[i], (max_tokens_per_turn or shape.budget) - in_turn[i]]
            if min(limits) > 0:  # only the grant ended: go on with the same turn
                submit_turn(i)
                return
            end(i)  # the budget or the per-turn limit cut the turn: truncated
            return
        turn_no[i] += 1
        in_turn[i] = 0
        out_of_budget = response[i] + t.tool_tokens >= shape.budget
        if turn_no[i] >= len(shape.turns) or out_of_budget:
            end(i)
            return
        at(clock + t.tool_s, "tool", (i, t.tool_tokens))

    def engine_dies(e: int) -> None:
        nonlocal recomputed
        engine = eng[e]
        engine.alive = False
        pol.remove_engine(e)
        lost = engine.running + list(engine.waiting)
        engine.running, engine.waiting = [], deque()
        for seq in lost:
            recomputed += seq.generated
            pol.release(e, seq.request)
            del seqs[seq.request.seq]
            i = seq.traj
            if last_engine[i] == e:
                last_engine[i] = None
            submit_turn(i)  # the same turn again, elsewhere

    for i in range(len(shapes)):
        pol.open(str(i))
    for i in range(len(shapes)):
        submit_turn(i)
    if kill is not None:
        at(kill[1], "kill", kill[0])
    pump()
    while events:
        clock, _, kind, data = heapq.heappop(events)
        if kind == "step":
            step_done(*data)
        elif kind == "tool":
            i, tool_tokens = data
            response[i] += tool_tokens
            submit_turn(i)
        elif kind == "kill":
            engine_dies(data)
        pump()
    waits.sort()
    busy = sum(x.busy_s for x in eng)
    return SimResult(
        policy=pol.name,
        trajectories=len(shapes),
        finished=finished,
        makespan_s=clock,
        generated_tokens=generated,
        tokens_per_s=generated / clock if clock else 0.0,
        busy_share=busy / (len(eng) * clock) if clock else 0.0,
        evictions=evictions,
        recomputed_tokens=recomputed,
        wait_mean_s=sum(waits) / len(waits) if waits else 0.0,
        wait_p95_s=waits[int(0.95 * (len(waits) - 1))] if waits else 0.0,
        max_reserved_share=max_res,
        max_kv_share=max_kv,
    )
