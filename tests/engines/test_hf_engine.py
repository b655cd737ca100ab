"""HFEngine on a real (tiny, random) Qwen2 model loaded through from_pretrained."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rstar2.engines.base import SamplingParams
from rstar2.engines.hf import HFEngine
from rstar2.engines.sampling import filter_logits, inverse_cdf


@pytest.fixture
async def engine(tiny):
    eng = HFEngine(tiny[0], max_batch_size=16)
    yield eng
    await eng.close()


def prompts(tok, n):
    return [tok.encode(f"question number {i}: " + "x" * (i % 5), add_special_tokens=False) for i in range(n)]


async def test_logprobs_match_a_teacher_forced_pass(engine, tiny):
    model, tok = tiny
    ps = prompts(tok, 6)
    gens = await asyncio.gather(
        *(
            engine.generate(p, SamplingParams(max_new_tokens=12 + i, temperature=0.8, seed=i))
            for i, p in enumerate(ps)
        )
    )
    for p, g in zip(ps, gens, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([p + g.token_ids])).logits[0].float() / 0.8
        ref = logits.log_softmax(-1)[len(p) - 1 : -1].gather(1, torch.tensor(g.token_ids)[:, None]).squeeze(1)
        assert torch.allclose(ref, torch.tensor(g.logprobs), atol=1e-4)


async def test_concurrent_requests_are_batched_and_seeds_reproduce(engine, tiny):
    tok = tiny[1]
    ps = prompts(tok, 12)
    params = [SamplingParams(max_new_tokens=8, temperature=1.0, seed=100 + i) for i in range(12)]
    together = await asyncio.gather(*(engine.generate(p, sp) for p, sp in zip(ps, params, strict=True)))
    assert engine.stats["batches"] < engine.stats["requests"]  # they shared batches
    alone = [await engine.generate(ps[i], params[i]) for i in (0, 5, 11)]
    assert [g.token_ids for g in alone] == [together[i].token_ids for i in (0, 5, 11)]


async def test_stop_tokens_length_and_banned_tokens(engine, tiny):
    tok = tiny[1]
    p = prompts(tok, 1)[0]
    greedy = await engine.generate(p, SamplingParams(max_new_tokens=10, temperature=0))
    assert greedy.finish_reason == "length" and len(greedy.token_ids) == 10
    stop = greedy.token_ids[3]
    first = greedy.token_ids.index(stop)
    stopped = await engine.generate(
        p, SamplingParams(max_new_tokens=10, temperature=0, stop_token_ids=(stop,))
    )
    assert stopped.finish_reason == "stop" and stopped.token_ids == greedy.token_ids[: first + 1]
    banned = tuple(greedy.token_ids)
    other = await engine.generate(
        p, SamplingParams(max_new_tokens=10, temperature=0, banned_token_ids=banned)
    )
    assert not set(other.token_ids) & set(banned)


async def test_bad_requests_get_clear_errors_and_the_engine_goes_on(engine, tiny):
    with pytest.raises(ValueError, match="no room"):
        await engine.generate([1] * 5000, SamplingParams(max_new_tokens=8))
    with pytest.raises(ValueError, match="empty"):
        await engine.generate([], SamplingParams(max_new_tokens=8))
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(max_new_tokens=8, top_p=0)
    g = await engine.generate([5, 6, 7], SamplingParams(max_new_tokens=3))
    assert len(g.token_ids) == 3


def test_top_k_and_top_p_keep_the_right_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]]))
    out = filter_logits(logits, torch.tensor([2, 0]), torch.tensor([1.0, 0.7]))
    assert torch.isfinite(out[0]).tolist() == [True, True, False, False]  # top-2
    assert torch.isfinite(out[1]).tolist() == [True, True, False, False]  # 0.5 + 0.3 reach 0.7


def test_inverse_cdf_samples_the_distribution_and_never_a_zero_token():
    probs = torch.tensor([[0.0, 0.2, 0.0, 0.5, 0.3, 0.0]]).repeat(20_000, 1)
    u = torch.rand(20_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    picked = inverse_cdf(probs, u)
    counts = torch.bincount(picked, minlength=6).double() / 20_000
    assert counts[[0, 2, 5]].sum() == 0
    assert torch.allclose(counts, probs[0].double(), atol=0.015)
    # the edges: u = 0 takes the first token with mass, u = 1 the last one, even if the sum rounds low
    edge = inverse_cdf(torch.tensor([[0.0, 0.3, 0.7 - 1e-7, 0.0]] * 2), torch.tensor([0.0, 1.0]))
    assert edge.tolist() == [1, 2]
