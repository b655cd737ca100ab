"""The rollout scheduler: policies on random workloads (through the simulator, which drives the real
policy objects), the asyncio ``Scheduler`` over stand-in engines, and a Rollout that loses an engine."""

from __future__ import annotations

import asyncio
import random

import pytest

from benchmarks.scheduler_model import Cost, ToolLatency, simulate, workload
from rstar2.engines.base import Generation, SamplingParams
from rstar2.rollout.scheduler import KVCapacity, LeastRequests, NoEngineError, Request, Scheduler, Static


class Watched(KVCapacity):
    """The kv policy, checking after every admission that no engine's reservations exceed it."""

    worst = 0.0

    def _start(self, request, engine, granted=None):
        out = super()._start(request, engine, granted)
        assert self.reserved[engine] <= self.capacity[engine], (self.reserved, self.capacity)
        self.worst = max(self.worst, self.reserved[engine] / self.capacity[engine])
        return out


def random_case(seed: int):
    rng = random.Random(seed)
    shapes = workload(
        rng.randint(8, 48),
        seed=seed,
        budgets=(rng.choice([1024, 2048]), 3072),
        max_turns=rng.randint(1, 6),
        median_turn_tokens=rng.choice([60, 200, 500]),
        tool=ToolLatency(0.02, rng.choice([0.1, 2.0])),
        group=rng.choice([1, 4]),
    )
    engines = rng.randint(1, 4)
    capacities = [rng.choice([4096, 8192, 16384]) for _ in range(engines)]
    return shapes, capacities, rng.choice([None, 64, 256])


@pytest.mark.parametrize("seed", range(12))
def test_kv_never_oversubscribes_and_every_trajectory_finishes(seed):
    shapes, capacities, grant = random_case(seed)
    policy = Watched(capacities, grant_tokens=grant)
    result = simulate(shapes, policy)
    assert result.finished == len(shapes)
    assert result.evictions == 0 and result.recomputed_tokens == 0
    assert policy.worst <= 1.0 and result.max_kv_share <= 1.0
    assert policy.queue == [] and sum(policy.reserved) == 0 and sum(policy.running) == 0


@pytest.mark.parametrize("seed", range(12))
def test_kv_is_never_much_slower_than_static(seed):
    shapes, capacities, grant = random_case(seed)
    kv = simulate(shapes, KVCapacity(capacities, grant_tokens=grant))
    static = simulate(shapes, Static(capacities))
    assert static.finished == kv.finished == len(shapes)
    assert kv.makespan_s <= static.makespan_s * 1.05, (kv, static)


def test_on_a_heavy_tailed_batch_kv_beats_static_and_does_not_evict():
    shapes = workload(96, seed=3, group=8, median_turn_tokens=600, budgets=(8192,))
    runs = {
        name: simulate(shapes, name, engines=3, capacity=32768) for name in ("static", "least_requests", "kv")
    }
    assert runs["kv"].tokens_per_s > 1.3 * runs["static"].tokens_per_s
    assert runs["kv"].evictions == 0
    assert runs["static"].busy_share < runs["kv"].busy_share
    assert all(r.generated_tokens == runs["kv"].generated_tokens for r in runs.values())  # same work


@pytest.mark.parametrize("name", ["kv", "least_requests", "static"])
def test_a_killed_engine_loses_no_trajectory(name):
    shapes = workload(40, seed=5, median_turn_tokens=300, budgets=(4096,))
    whole = simulate(shapes, name, engines=3, capacity=32768)
    killed = simulate(shapes, name, engines=3, capacity=32768, kill=(1, whole.makespan_s / 3))
    assert killed.finished == len(shapes)
    assert killed.generated_tokens == whole.generated_tokens  # every turn was redone in full elsewhere


def test_a_turn_larger_than_every_engine_is_refused_with_a_reason():
    policy = KVCapacity([1000, 2000], grant_tokens=1000)
    policy.submit(Request("t", 1500, 1000))
    assert policy.admit() == []
    ((req, why),) = policy.rejected
    assert "at least 2500 KV tokens" in why and "largest engine holds 2000" in why


def test_oldest_request_is_not_starved_by_small_ones():
    policy = KVCapacity([1000], max_bypass=3, grant_tokens=1000)  # whole turns only
    first = policy.submit(Request("s0", 100, 100))
    assert policy.admit() == [(first, 0)]
    big = policy.submit(Request("big", 500, 400))  # 900: does not fit beside the first (200)
    small = [policy.submit(Request(f"s{i + 1}", 50, 50)) for i in range(10)]
    admitted = policy.admit()
    assert [r.trajectory for r, _ in admitted] == [
        "s1",
        "s2",
        "s3",
    ]  # passed over 3 times, then the line holds
    assert policy.admit() == []  # room for more small ones, but the big one goes first
    for req, engine in [(first, 0), *admitted]:
        policy.release(engine, req)
    assert [r.trajectory for r, _ in policy.admit()] == ["big", "s4"]
    assert big.bypassed == 3 and small[3].bypassed == 0


def test_next_turn_goes_back_to_its_engine_unless_another_is_mostly_free():
    policy = KVCapacity([1000, 1000], spill_free_share=0.8, grant_tokens=1000)
    a = policy.submit(Request("a", 100, 100))
    b = policy.submit(Request("b", 100, 100))
    assert policy.admit() == [(a, 0), (b, 1)]
    policy.release(1, b)  # engine 1 is now the freer one (1000 vs 800)
    a2 = policy.submit(Request("a", 300, 100, previous=0, turn=1))
    assert policy.admit() == [(a2, 0)]  # back where its prefix is cached
    c = policy.submit(Request("c", 400, 100, previous=0, turn=1))
    assert policy.admit() == [(c, 1)]  # engine 0 is short (400 free), engine 1 is wholly free
    d = policy.submit(Request("d", 350, 100, previous=0, turn=1))
    assert policy.admit() == []  # engine 1 could take it (500 free) but is not mostly free: wait
    policy.release(0, a2)
    assert policy.admit() == [(d, 0)]


def test_a_next_turn_leaves_a_crowded_engine_for_an_idle_one():
    policy = KVCapacity([10_000, 10_000], rebalance_gap=4, grant_tokens=100)
    for i in range(4):
        policy.submit(Request(f"t{i}", 100, 100, previous=0))
    assert {e for _, e in policy.admit()} == {0}  # sticky while the gap is small
    nxt = policy.submit(Request("t9", 100, 100, previous=0, turn=1))
    assert policy.admit() == [(nxt, 1)]  # four running on engine 0, none on engine 1


def test_static_waits_at_every_turn_for_every_open_trajectory():
    policy = Static([10_000, 10_000])
    for t in ("a", "b"):
        policy.open(t)
    first = [policy.submit(Request(t, 10, 10)) for t in ("a", "b")]
    assert {e for _, e in policy.admit()} == {0, 1}
    policy.release(0, first[0])
    policy.submit(Request("a", 30, 10, turn=1))
    assert policy.admit() == []  # b has not finished turn 0
    policy.release(1, first[1])
    policy.close("b")  # b ended
    assert [r.trajectory for r, _ in policy.admit()] == ["a"]


def test_least_requests_spreads_and_keeps_a_trajectory_where_it_was():
    policy = LeastRequests([1, 1])
    a = policy.submit(Request("t1", 10, 10))
    b = policy.submit(Request("t2", 10, 10))
    assert sorted(e for _, e in policy.admit()) == [0, 1]
    policy.release(0, a)
    policy.release(1, b)
    nxt = policy.submit(Request("t2", 20, 10, previous=1, turn=1))
    assert policy.admit() == [(nxt, 1)]


# -- the asyncio Scheduler over stand-in engines ---------------------------------------------------
class Slow:
    """A stand-in engine: answers after a delay and records how many tokens it was holding."""

    def __init__(self, name: str, capacity: int, fail: bool = False):
        self.name, self.capacity_tokens, self.in_flight, self.fail = name, capacity, 0, fail
        self.holding = 0
        self.peak = 0

    async def generate(self, prompt_ids, params):
        if self.fail:
            raise ConnectionError(f"{self.name} went away")
        self.holding += len(prompt_ids) + params.max_new_tokens
        self.peak = max(self.peak, self.holding)
        await asyncio.sleep(random.random() * 0.01)
        self.holding -= len(prompt_ids) + params.max_new_tokens
        n = min(params.max_new_tokens, 5)
        return Generation([7] * n, [-1.0] * n, "stop" if n < params.max_new_tokens else "length")

    async def close(self):
        pass


async def test_scheduler_never_holds_more_than_an_engine_can_take():
    engines = [Slow("a", 600), Slow("b", 300)]
    sched = Scheduler(engines, "kv", grant_tokens=100)

    async def turn(i: int):
        req = Request(f"t{i}", 50 + i % 7 * 20, 100)
        engine = await sched.acquire(req)
        try:
            await engine.generate([1] * req.context_tokens, SamplingParams(max_new_tokens=req.granted))
        finally:
            sched.release(engine, req)

    await asyncio.gather(*(turn(i) for i in range(60)))
    assert engines[0].peak <= 600 and engines[1].peak <= 300
    assert engines[0].peak > 300  # and it did use the room it had
    assert sched.admitted == 60 and sched.policy.queue == [] and sum(sched.policy.reserved) == 0


async def one_engine_and_a_waiter():
    """One engine of 100 tokens holding a first turn (90), and a second turn waiting for room."""
    sched = Scheduler([Slow("a", 100)], "kv", grant_tokens=100)
    first = Request("t0", 50, 40)
    engine = await sched.acquire(first)
    waiter = asyncio.ensure_future(sched.acquire(Request("t1", 50, 40)))
    await asyncio.sleep(0.01)
    return sched, engine, first, waiter


async def test_the_last_engine_is_never_taken_out_of_rotation():
    sched, engine, first, waiter = await one_engine_and_a_waiter()
    assert not waiter.done()  # no room until the first turn ends
    assert sched.fail(engine) is False  # the last engine stays: its turns end as errors instead
    sched.release(engine, first)
    assert await waiter is engine


async def test_a_cancelled_waiter_gives_its_place_back():
    sched, engine, first, waiter = await one_engine_and_a_waiter()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert sched.policy.queue == []
    sched.release(engine, first)
    assert sum(sched.policy.reserved) == 0


async def test_too_large_a_turn_fails_fast():
    sched = Scheduler([Slow("a", 100)], "kv", grant_tokens=100)
    with pytest.raises(NoEngineError, match="largest engine holds 100"):
        await sched.acquire(Request("t", 90, 50))


def test_cost_model_is_affine():
    c = Cost(base_s=0.01, per_seq_s=0.001, per_prefill_token_s=0.0001)
    assert c.step_s(10, 100) == pytest.approx(0.01 + 0.01 + 0.01)
