"""Issue 15: requests join the running batch, a trajectory's KV is kept across its turns, and
nothing computed under old weights is used after new ones. Every generation is checked against a
teacher-forced pass over the same ids (fp32, CPU: 1e-4)."""

from __future__ import annotations

import asyncio
import collections
import copy
import time

import pytest
import torch

from rstar2.engines.base import SamplingParams
from rstar2.engines.hf import HFEngine
from rstar2.engines.kv import PrefixStore, SeqKV


def teacher_forced(model, prompt: list[int], out: list[int], temperature: float = 1.0) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0].float() / temperature
    return logits.log_softmax(-1)[len(prompt) - 1 : -1].gather(1, torch.tensor(out)[:, None]).squeeze(1)


def assert_matches(model, prompt, gen, temperature=1.0):
    ref = teacher_forced(model, prompt, gen.token_ids, temperature)
    assert torch.allclose(ref, torch.tensor(gen.logprobs), atol=1e-4), (
        (ref - torch.tensor(gen.logprobs)).abs().max()
    )


@pytest.fixture
def model(tiny):
    return copy.deepcopy(tiny[0])  # tests here change weights


@pytest.fixture
def prompt(tiny):
    return tiny[1].encode("question: what is 12 + 30? think and call the tool", add_special_tokens=False)


async def test_a_request_joins_the_running_batch_and_leaves_before_it_ends(model, prompt):
    engine = HFEngine(model, max_batch_size=8)
    long_params = SamplingParams(max_new_tokens=300, temperature=1.0, seed=1)
    long = asyncio.create_task(engine.generate(prompt, long_params))
    while engine.stats["steps"] < 5:  # the long one is decoding
        await asyncio.sleep(0.001)
    t0 = time.perf_counter()
    short = await engine.generate(prompt[:5], SamplingParams(max_new_tokens=8, temperature=1.0, seed=2))
    short_done = time.perf_counter() - t0
    assert not long.done(), "the short request waited for the long one"
    g = await long
    assert engine.stats["batches"] == 2  # two admissions: the long one, then the short one joining it
    assert engine.stats["steps"] < len(g.token_ids) + len(short.token_ids)  # they shared steps
    assert short_done > 0 and len(short.token_ids) == 8
    assert_matches(model, prompt, g)
    assert_matches(model, prompt[:5], short)
    await engine.close()


async def test_the_next_turn_prefills_only_its_new_tokens_and_samples_the_same(model, prompt):
    engine = HFEngine(model, max_batch_size=8)
    plain = HFEngine(model, max_batch_size=8, keep_tokens=0)
    assert engine.prefix_cache and not plain.prefix_cache
    first = await engine.generate(prompt, SamplingParams(max_new_tokens=12, seed=3))
    tool = [7, 8, 9, 10, 11]  # the tool's response, as the rollout appends it
    second_prompt = prompt + first.token_ids + tool
    before = engine.stats["prefill_tokens"]
    second = await engine.generate(second_prompt, SamplingParams(max_new_tokens=12, seed=4))
    assert engine.stats["reused_tokens"] == len(prompt) + len(first.token_ids) - 1
    assert engine.stats["prefill_tokens"] - before == len(tool) + 1  # the last sampled id, then the tool's
    assert_matches(model, second_prompt, second)
    again = await plain.generate(second_prompt, SamplingParams(max_new_tokens=12, seed=4))
    assert again.token_ids == second.token_ids  # the same seed, with or without the kept prefix
    await engine.close()
    await plain.close()


async def test_new_weights_drop_kept_prefixes(model, prompt):
    engine = HFEngine(model, max_batch_size=8)
    first = await engine.generate(prompt, SamplingParams(max_new_tokens=10, seed=5))
    with torch.no_grad():  # an optimizer step on the shared model: parameters written in place
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    nxt = prompt + first.token_ids + [3, 4]
    second = await engine.generate(nxt, SamplingParams(max_new_tokens=10, seed=6))
    assert engine.stats["reused_tokens"] == 0
    assert_matches(model, nxt, second)  # the new weights' logprobs, not a stale prefix's
    await engine.close()


async def test_running_rows_are_prefilled_again_when_weights_change_under_them(model, prompt):
    engine = HFEngine(model, max_batch_size=8)
    task = asyncio.create_task(engine.generate(prompt, SamplingParams(max_new_tokens=200, seed=7)))
    while engine.stats["steps"] < 20:
        await asyncio.sleep(0.001)
    changed = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}
    await asyncio.to_thread(engine.update_weights, changed, 1)
    g = await task
    assert engine.stats["reprefills"] == 1
    # the last tokens were sampled from the new weights over the whole context
    assert_matches(
        model, prompt + g.token_ids[:-5], type(g)(g.token_ids[-5:], g.logprobs[-5:], g.finish_reason)
    )
    await engine.close()


async def test_a_group_shares_its_prompt_prefill_and_each_matches_a_teacher_forced_pass(model, prompt):
    engine = HFEngine(model, max_batch_size=16)
    prompts = [prompt + [20 + i, 21 + i] for i in range(6)] + [prompt] * 4  # a group: identical prompts too
    gens = await asyncio.gather(
        *(engine.generate(p, SamplingParams(max_new_tokens=6, seed=10 + i)) for i, p in enumerate(prompts))
    )
    assert engine.stats["shared_tokens"] >= 9 * len(prompt)  # the common prefix prefilled once
    assert engine.stats["prefill_tokens"] < 2 * len(prompt) + 6 * 2 + 10
    for p, g in zip(prompts, gens, strict=True):
        assert_matches(model, p, g)
    await engine.close()


async def test_one_bad_request_fails_alone_and_the_engine_goes_on(model, prompt):
    engine = HFEngine(model, max_batch_size=8)
    vocab = model.config.vocab_size
    with pytest.raises(ValueError, match="outside the vocabulary"):
        await engine.generate(prompt + [vocab + 5], SamplingParams(max_new_tokens=3))
    good = await asyncio.gather(
        *(engine.generate(prompt, SamplingParams(max_new_tokens=4, seed=i)) for i in range(3))
    )
    assert all(len(g.token_ids) == 4 for g in good)
    await engine.close()


def test_the_scheduler_sees_the_capacity_left_after_kept_prefixes(model):
    engine = HFEngine(model, capacity_tokens=10_000, keep_tokens=2_500)
    assert engine.capacity_tokens == 7_500 and engine.store.budget_tokens == 2_500


def _seq(ids, shared=False):
    t = [torch.zeros(1, 1, len(ids), 2)]
    return SeqKV(tuple(ids), t, t, shared)


def test_the_prefix_store_keeps_within_its_budget_least_recently_used_first_out():
    store = PrefixStore(budget_tokens=10)
    store.put(_seq([1, 2, 3, 4]))
    store.put(_seq([5, 6, 7, 8]))
    store.put(_seq([9, 9, 9, 9]))  # 12 > 10: the oldest goes
    assert len(store) == 2 and store.evicted == 1 and store.tokens == 8
    assert store.take([1, 2, 3, 4, 5]) is None
    got = store.take([5, 6, 7, 8, 0])
    assert got is not None and got.ids == (5, 6, 7, 8) and len(store) == 1  # consumed by its turn
    assert store.take([9, 9, 9, 9]) is None  # nothing new after it: not a prefix to reuse
    store.clear()  # what the engine does when the weights change
    assert store.take([9, 9, 9, 9, 1]) is None and len(store) == 0 and store.tokens == 0


def test_shared_prefixes_serve_many_requests_and_the_longest_prefix_wins():
    store = PrefixStore(budget_tokens=100)
    store.put(_seq([1, 2], shared=True))
    store.put(_seq([1, 2, 3, 4]))
    assert store.take([1, 2, 3, 4, 5]).ids == (1, 2, 3, 4)
    assert store.take([1, 2, 7]).ids == (1, 2) and store.take([1, 2, 8]).ids == (1, 2)


class ForcedCalls:
    """The real engine writes each turn's text, then a scripted tool call follows (a random tiny
    model would rarely write one): the rollout's next turn extends the kept sequence."""

    def __init__(self, engine: HFEngine, fmt, end_id: int) -> None:
        self.engine, self.fmt, self.end_id = engine, fmt, end_id
        self.name, self.capacity_tokens, self.prefix_cache = "forced", engine.capacity_tokens, True
        self.call = fmt.encode(
            '<tool_call>{"name": "execute_python_code_with_standard_io", "arguments": {"code": "print(6 * 7)"}}</tool_call>'
        )

    @property
    def in_flight(self) -> int:
        return self.engine.in_flight

    async def generate(self, prompt_ids, params):
        self.banned = tuple(params.stop_token_ids) + tuple(params.banned_token_ids)
        g = await self.engine.generate(
            prompt_ids, SamplingParams(max_new_tokens=6, seed=params.seed, banned_token_ids=self.banned)
        )
        nan = float("nan")  # the scripted ids were not sampled: no logprob to check
        return type(g)(
            g.token_ids + self.call + [self.end_id], g.logprobs + [nan] * (len(self.call) + 1), "stop"
        )

    async def close(self) -> None:
        pass


async def test_multi_turn_rollouts_on_smollm2s_template_reuse_kv_and_keep_the_invariants(
    model, smollm2_tokenizer
):
    from rstar2.chat.format import ChatFormat
    from rstar2.config import RolloutSection
    from rstar2.rollout import Rollout
    from rstar2.sandbox import LocalPool

    fmt = ChatFormat(smollm2_tokenizer)
    engine = HFEngine(model, max_batch_size=8)
    policy = ForcedCalls(engine, fmt, smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>"))
    async with LocalPool(workers=1) as pool:
        rollout = Rollout(policy, fmt, pool, None, RolloutSection(max_turns=3, max_response_tokens=2000))
        trajs = await rollout.run_many([{"problem": f"What is 6 * {7 + i}?", "seed": i} for i in range(4)])
    assert engine.stats["reused_tokens"] > 0 and engine.stats["shared_tokens"] > 0
    for traj in trajs:
        assert len(traj.turns) == 3 and all(c.status == "ok" for c in traj.calls)
        # ids decode to the template's rendering of the same conversation
        messages = fmt.problem_messages(traj.problem)
        for turn in traj.turns:
            messages.append({"role": "assistant", "content": turn.text})
            messages += [{"role": "tool", "content": c.response} for c in turn.calls]
        # (the last turn's tool response is followed by the next assistant header: max_turns ended it)
        assert fmt.decode(traj.prompt_ids + traj.response_ids) == fmt.render(
            messages, add_generation_prompt=True
        )
        # every sampled id's logprob is the model's over the whole conversation so far
        full = traj.prompt_ids + traj.response_ids
        with torch.no_grad():  # the engine's distribution: banned ids (the end of turn) never sampled
            logits = model(torch.tensor([full])).logits[0].float()
            logits[:, list(policy.banned)] = float("-inf")
            ref = logits.log_softmax(-1)
        n = len(traj.prompt_ids)
        for i, (tok_id, lp) in enumerate(zip(traj.response_ids, traj.logprobs, strict=True)):
            if traj.loss_mask[i] and lp == lp:  # sampled by the engine (not NaN)
                assert abs(float(ref[n + i - 1, tok_id]) - lp) < 1e-4
    await engine.close()


def test_slots_hold_each_rows_own_cache_through_joins_decodes_and_leaves(model):
    """Rows of different lengths join, decode, leave (the last row moving into the hole) and are
    copied, in a random order: every row's columns then equal a fresh prefill of its tokens, and
    the running batch's next-token logits equal a teacher-forced pass over each row alone."""
    from rstar2.engines.kv import SlotCache

    rng = __import__("random").Random(3)
    vocab = model.config.vocab_size
    kv, tokens, logits, labels = SlotCache(), [], [], []  # labels: who occupies each slot

    def forward(span, news):
        width = max(len(n) for n in news)
        ids = torch.zeros((len(news), width), dtype=torch.long)
        for r, n in enumerate(news):
            ids[r, width - len(n) :] = torch.tensor(n)
        pos, mask = kv.plan(span, [len(n) for n in news], width)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=kv, logits_to_keep=1)
        kv.commit(span, [len(n) for n in news])
        return list(out.logits[:, -1])

    with torch.no_grad():
        for _ in range(12):
            op = rng.choice(["join", "join", "decode", "decode", "leave", "copy"])
            if op == "join" or not tokens:
                news = [
                    [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
                    for _ in range(rng.randint(1, 3))
                ]
                start = kv.rows
                new_labels = [object() for _ in news]
                kv.add([None] * len(news), new_labels)
                labels += new_labels
                logits += forward((start, kv.rows), news)
                tokens += news
            elif op == "decode":
                news = [[rng.randrange(vocab)] for _ in tokens]
                logits = forward((0, kv.rows), news)
                tokens = [t + n for t, n in zip(tokens, news, strict=True)]
            elif op == "leave":
                i = rng.randrange(len(tokens))
                kv.remove(i)
                tokens[i], logits[i], labels[i] = tokens[-1], logits[-1], labels[-1]
                labels.pop()
                tokens.pop()
                logits.pop()
            else:
                i = rng.randrange(len(tokens))
                labels.append(object())
                kv.copy_row(i, labels[-1])
                tokens.append(list(tokens[i]))
                logits.append(logits[i])
        assert kv.rows == len(tokens) >= 1 and kv.owners == labels  # each slot's owner moved with it
        for r, seq in enumerate(tokens):
            ref = model(input_ids=torch.tensor([seq]), use_cache=True)
            assert torch.allclose(ref.logits[0, -1], logits[r], atol=1e-4)
            own = kv.sequence(r, tuple(seq))
            for layer, k in zip(ref.past_key_values.layers, own.keys, strict=True):
                assert torch.allclose(layer.keys, k, atol=1e-5)


async def test_eager_attention_gets_an_additive_mask_and_the_same_logprobs(tiny_dir, prompt):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, attn_implementation="eager")
    engine = HFEngine(model, max_batch_size=4)
    gens = await asyncio.gather(
        *(
            engine.generate(prompt[: 6 + 4 * i], SamplingParams(max_new_tokens=12, temperature=1.0, seed=i))
            for i in range(3)
        )
    )
    for i, g in enumerate(gens):
        assert_matches(model, prompt[: 6 + 4 * i], g)
    await engine.close()


def test_attention_the_engine_cannot_mask_is_refused_up_front(tiny_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    model.config._attn_implementation = "flash_attention_2"  # as loaded on a GPU with that kernel
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        HFEngine(model)


def test_a_failed_join_leaves_the_running_rows_as_they_were(model, prompt):
    """A join that fails in its forward pass is undone: the running rows keep their cache."""
    from rstar2.engines.batch import Request, Row, RunningBatch
    from rstar2.engines.kv import PrefixStore

    loop = asyncio.new_event_loop()

    def row(ids):
        return Row(Request(ids, SamplingParams(max_new_tokens=4), loop, loop.create_future()), 4, None)

    stats = collections.defaultdict(float)
    batch = RunningBatch(model, torch.device("cpu"), 8, 0, PrefixStore(4096), stats)
    with torch.no_grad():
        batch.join([row(prompt), row(prompt[:7])])
        before = [
            batch.kv.sequence(i, tuple(r.req.prompt_ids)).keys[0].clone() for i, r in enumerate(batch.rows)
        ]
        real = batch.forward
        batch.forward = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom"))
        with pytest.raises(RuntimeError, match="boom"):
            batch.join([row(prompt[:9])])
        batch.forward = real
        assert batch.kv.rows == len(batch.rows) == 2
        for i, r in enumerate(batch.rows):
            assert torch.equal(batch.kv.sequence(i, tuple(r.req.prompt_ids)).keys[0], before[i])
        batch.step()  # and the batch decodes on
    assert stats["steps"] == 1 and stats["row_steps"] == 2
    loop.close()


def test_a_finished_batch_frees_its_cache_without_the_garbage_collector(model):
    """No reference cycle holds a batch's buffers (gigabytes on a real model) once it is dropped."""
    import gc
    import weakref

    from rstar2.engines.kv import SlotCache

    kv = SlotCache(max_rows=4)
    kv.add([None, None], ["a", "b"])
    pos, mask = kv.plan((0, 2), [3, 2], 3)
    with torch.no_grad():
        model(input_ids=torch.ones((2, 3), dtype=torch.long), attention_mask=mask, position_ids=pos, cache=kv)
    kv.commit((0, 2), [3, 2])
    assert len(kv.buf_k) == model.config.num_hidden_layers and kv.rows_cap == 2
    buffers = weakref.ref(kv.buf_k[0])
    gc.disable()
    try:
        del kv
        assert buffers() is None
    finally:
        gc.enable()


async def test_a_closed_engine_keeps_no_prefixes(model, prompt):
    engine = HFEngine(model, keep_tokens=4096)
    await engine.generate(prompt, SamplingParams(max_new_tokens=4, temperature=1.0, seed=0))
    assert len(engine.store) >= 1  # the finished request's sequence was kept for a next turn
    await engine.close()
    assert len(engine.store) == 0 and engine.store.tokens == 0


async def test_weights_written_through_param_data_count_once_announced(model, prompt):
    """torch does not count writes through ``param.data``: the stamp alone misses them, so the
    trainer announces each update (``invalidate``) and nothing computed before is reused."""
    from rstar2.engines.hf import weights_stamp

    engine = HFEngine(model, max_batch_size=8)
    first = await engine.generate(prompt, SamplingParams(max_new_tokens=10, seed=5))
    before = weights_stamp(model)
    with torch.no_grad():
        for p in model.parameters():
            p.data.add_(0.05 * torch.randn_like(p))
    assert weights_stamp(model) == before  # the miss this guards against
    engine.invalidate(1)
    nxt = prompt + first.token_ids + [3, 4]
    second = await engine.generate(nxt, SamplingParams(max_new_tokens=10, seed=6))
    assert engine.stats["reused_tokens"] == 0
    assert_matches(model, nxt, second)
    await engine.close()


async def test_short_of_rows_the_engine_admits_by_priority_then_arrival(model, prompt):
    """A trajectory's next turn (lower priority value) goes ahead of new requests when the rows
    are full; equal priorities keep their arrival order."""
    engine = HFEngine(model, max_batch_size=1)
    order: list[str] = []

    async def ask(name: str, priority: int) -> None:
        params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=len(order), priority=priority)
        await engine.generate(prompt, params)
        order.append(name)

    # arrival order a, b, c, d, e (one burst); one row: admitted one at a time, by priority
    await asyncio.gather(ask("a", 5), ask("b", 9), ask("c", 1), ask("d", 9), ask("e", -3))
    assert order == ["e", "c", "a", "b", "d"]
    counters = await engine.counters()
    assert counters["rows"] == 1 and counters["requests"] == 5 and counters["evictions"] >= 0
    await engine.close()


async def test_a_weight_write_waits_for_the_step_in_progress_not_for_the_engine_to_go_idle(model, prompt):
    """The engine's thread releases its lock and takes it again at once after every step, so a
    writer (``update_weights``/``invalidate``, the trainer after each update) could wait through
    many steps. A writer first takes the engine's gate: while it holds it the engine finishes the
    step in progress and starts no other; then the write goes through and decoding goes on."""
    engine = HFEngine(model, max_batch_size=8)
    params = SamplingParams(max_new_tokens=400, temperature=1.0, seed=1)
    running = [asyncio.create_task(engine.generate(prompt, params)) for _ in range(4)]
    while engine.stats["steps"] < 5:
        await asyncio.sleep(0.001)
    with engine._gate:  # a writer has arrived and waits for the lock
        before = engine.stats["steps"]
        await asyncio.sleep(0.3)
        held = engine.stats["steps"] - before
    assert held <= 1, held  # at most the step in progress
    steps = engine.stats["steps"]
    await asyncio.to_thread(engine.invalidate, 1)  # the whole write, gate and lock
    while engine.stats["steps"] < steps + 3:  # and decoding goes on
        await asyncio.sleep(0.001)
    assert all(not t.done() for t in running)
    await asyncio.gather(*running)
    await engine.close()


async def test_a_weight_load_carries_its_version_and_a_bad_one_changes_nothing(model, prompt):
    """Every write says which policy it holds; a state dict that does not fit writes nothing; a
    write that fails half way fails the rows decoding and leaves the engine refusing requests
    (never half-written weights under the old version) until a whole load succeeds."""
    engine = HFEngine(model, max_batch_size=4)
    held = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="policy version"):
        engine.invalidate(None)
    name = next(iter(held))
    for bad in ({"no.such.tensor": held[name]}, {name: torch.zeros(3, 3)}):
        with pytest.raises(ValueError, match="nothing was loaded"):
            engine.update_weights(bad, 4)
    assert engine.version == 0 and all(torch.equal(model.state_dict()[k], v) for k, v in held.items())

    real = type(model).load_state_dict

    def half(self, state, strict=True):  # the first tensor written, then a failure
        first = dict([next(iter(state.items()))])
        real(self, first, strict=False)
        raise RuntimeError("disk went away")

    changed = {k: v + 0.05 for k, v in held.items()}
    running = asyncio.create_task(engine.generate(prompt, SamplingParams(max_new_tokens=400, seed=2)))
    while engine.stats["steps"] < 5:
        await asyncio.sleep(0.001)
    model.load_state_dict = half.__get__(model)
    try:
        with pytest.raises(RuntimeError, match="disk went away"):
            await asyncio.to_thread(engine.update_weights, changed, 5)
    finally:
        del model.load_state_dict
    assert engine.version == 0
    with pytest.raises(RuntimeError, match="holds no whole weights"):  # the row decoding then, too
        await running
    with pytest.raises(RuntimeError, match="holds no whole weights.*version 5 failed half way"):
        await engine.generate(prompt, SamplingParams(max_new_tokens=2))
    engine.update_weights(changed, 5)
    g = await engine.generate(prompt, SamplingParams(max_new_tokens=3, seed=1))
    assert g.versions == [5, 5, 5]
    assert_matches(model, prompt, g)
    await engine.close()


async def test_a_request_whose_caller_stopped_waiting_leaves_running_or_queued(model, prompt):
    """A caller that stops waiting (a stream whose client went away: its task cancelled) frees its
    row at the next step, and a request cancelled while queued never starts: the engine does not
    decode for nobody until the budget runs out."""
    engine = HFEngine(model, max_batch_size=1)
    never_stops = SamplingParams(max_new_tokens=400, temperature=1.0, seed=1)  # no stop ids
    running = asyncio.create_task(engine.generate(prompt, never_stops))
    while engine.stats["steps"] < 3:
        await asyncio.sleep(0.001)
    queued = asyncio.create_task(engine.generate(prompt, never_stops))  # waits: the one row is taken
    await asyncio.sleep(0.05)
    queued.cancel()
    running.cancel()
    at_cancel = engine.stats["row_steps"]
    answered = await engine.generate(prompt[:5], SamplingParams(max_new_tokens=4, seed=2))
    await engine.close()  # its thread ends only once no row is left
    assert len(answered.token_ids) == 4
    after = engine.stats["row_steps"] - at_cancel  # a step or two of the cancelled row, then the 4
    assert after < 100, after  # not the rest of 400 decoded for nobody
    assert engine.stats["abandoned"] == 2
