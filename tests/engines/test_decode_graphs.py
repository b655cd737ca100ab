"""The decode step in the static form CUDA graphs replay (engines/graphs.py), checked on the CPU:
rows padded to a bucket, attention over every column, inputs in static buffers. It must sample what
the eager step samples, through joins, leaves, kept prefixes and new weights; and it must contain
nothing that reads a tensor's value on the host (which a graph cannot record): run on the meta
device, any such read raises. The capture itself needs a GPU (tests/engines/test_cuda.py)."""

from __future__ import annotations

import asyncio
import collections
import copy

import pytest
import torch

from rstar2.engines.base import SamplingParams
from rstar2.engines.graphs import StaticDecode, buckets
from rstar2.engines.hf import HFEngine
from rstar2.engines.kv import SlotCache


@pytest.fixture
def model(tiny):
    return copy.deepcopy(tiny[0])


def test_buckets_cover_every_row_count_with_at_most_seven_padding_rows():
    assert buckets(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert buckets(3) == [1, 2, 3]
    assert buckets(12) == [1, 2, 4, 8, 12]
    for rows in (5, 12, 64):
        sizes = buckets(rows)
        for n in range(1, rows + 1):
            b = next(s for s in sizes if s >= n)
            assert b - n <= 7 and b <= rows


async def run(model, tok, graphs: bool, weight_change: bool | str = False):
    """Requests of different lengths and budgets, arriving apart (joins, leaves), a second turn
    extending a first (a kept prefix), and optionally new weights half-way."""
    eng = HFEngine(model, max_batch_size=6, cuda_graphs=graphs)
    prompts = [
        tok.encode(f"question {i}: what is {i} * 7? " * (1 + i % 3), add_special_tokens=False)
        for i in range(9)
    ]
    try:

        async def one(i):
            await asyncio.sleep(0.002 * i)
            p = SamplingParams(max_new_tokens=6 + 5 * (i % 4), temperature=1.0 if i % 2 else 0.0, seed=i)
            g = await eng.generate(prompts[i], p)
            if i % 3 == 0:  # the trajectory's next turn
                nxt = prompts[i] + g.token_ids + tok.encode(" ok", add_special_tokens=False)
                g2 = await eng.generate(nxt, SamplingParams(max_new_tokens=5, temperature=0.0))
                return g.token_ids, g.logprobs, g2.token_ids, g2.logprobs
            return g.token_ids, g.logprobs, [], []

        first = await asyncio.gather(*(one(i) for i in range(5)))
        if weight_change:
            with torch.no_grad():
                for prm in model.parameters():
                    # in place, seen by the engine itself; or through .data, told by the trainer
                    (prm.data if weight_change == "announced" else prm).mul_(1.01)
            if weight_change == "announced":
                eng.invalidate(1)
        second = await asyncio.gather(*(one(i) for i in range(5, 9)))
        return first + second, dict(eng.stats), eng.static_decode
    finally:
        await eng.close()


@pytest.mark.parametrize("weight_change", [False, "in_place", "announced"])
def test_the_static_step_samples_what_the_eager_step_samples(tiny, weight_change):
    model, tok = tiny
    eager, eager_stats, none = asyncio.run(run(copy.deepcopy(model), tok, False, weight_change))
    static, stats, step = asyncio.run(run(copy.deepcopy(model), tok, True, weight_change))
    assert none is None and isinstance(step, StaticDecode) and not step.capture
    assert stats["steps"] > 10 and stats["reused_tokens"] > 0  # decoded, and a kept prefix was used
    for (ids_e, lp_e, ids2_e, lp2_e), (ids_s, lp_s, ids2_s, lp2_s) in zip(eager, static, strict=True):
        assert ids_s == ids_e and ids2_s == ids2_e
        assert torch.allclose(torch.tensor(lp_s + lp2_s), torch.tensor(lp_e + lp2_e), atol=1e-4)


def test_padding_rows_write_only_their_scratch_column(model):
    """Three rows in a bucket of four: the fourth slot's columns other than the scratch one and the
    real rows' columns past their new token are untouched."""
    kv = SlotCache("cpu", 4)
    step = StaticDecode(model, torch.device("cpu"), 4, capture=False)
    with torch.no_grad():
        ids = torch.tensor([[5, 6, 7, 8], [1, 2, 3, 9], [4, 4, 4, 4]])
        kv.reserve(4, 16)  # the static step's rows and columns, so that no buffer moves
        kv.add([None] * 3, ["a", "b", "c"])
        pos, mask = kv.plan((0, 3), [4, 2, 3], 4)
        model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=kv, logits_to_keep=1)
        kv.commit((0, 3), [4, 2, 3])
        before = [b.clone() for b in kv.buf_k]
        logits = step.decode(kv, [10, 11, 12], pad_token_id=0)
    assert logits.shape[0] == 3 and kv.lens == [5, 3, 4]
    scratch = kv.cols_cap - 1
    for old, new in zip(before, kv.buf_k, strict=True):
        changed = (old != new).any(dim=1).any(dim=-1)  # (rows, columns) written
        written = {(int(r), int(c)) for r, c in changed.nonzero()}
        assert written <= {(0, 4), (1, 2), (2, 3), (3, scratch)}
        assert {(0, 4), (1, 2), (2, 3)} <= written


def test_the_static_step_reads_no_tensor_value_on_the_host(tiny_dir):
    """On the meta device a tensor has no values: ``.item()``, ``.tolist()`` or a branch on a tensor
    raise. The static step (the model's forward included) runs there, so a graph can record it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(tiny_dir)
    with torch.device("meta"):
        meta_model = AutoModelForCausalLM.from_config(config)
    meta = torch.device("meta")
    kv = SlotCache(meta, 8)
    layers, heads = config.num_hidden_layers, config.num_key_value_heads
    dim = config.hidden_size // config.num_attention_heads
    kv.rows_cap, kv.cols_cap = 8, 64
    kv.buf_k = [torch.empty((8, heads, 64, dim), device=meta) for _ in range(layers)]
    kv.buf_v = [torch.empty((8, heads, 64, dim), device=meta) for _ in range(layers)]
    kv.lens, kv.owners = [3, 9, 5], ["a", "b", "c"]
    step = StaticDecode(meta_model, meta, 8, capture=False)
    with torch.no_grad():
        logits = step.decode(kv, [1, 2, 3], pad_token_id=0)
    assert logits.shape == (3, config.vocab_size) and logits.device.type == "meta"
    with pytest.raises((RuntimeError, NotImplementedError)):  # the probe itself works
        torch.empty(2, device=meta).sum().item()


def test_eager_attention_gets_its_additive_mask_in_the_static_step_too(tiny_dir, tiny):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, attn_implementation="eager")
    eager, _, _ = asyncio.run(run(copy.deepcopy(model), tiny[1], False))
    static, _, _ = asyncio.run(run(copy.deepcopy(model), tiny[1], True))
    assert [r[0] + r[2] for r in static] == [r[0] + r[2] for r in eager]


def test_a_capture_that_fails_leaves_the_engine_decoding_eagerly(tiny, monkeypatch):
    """A graph that cannot be recorded (an op capture refuses) is said once, and every request is
    still answered, with the tokens of the eager step."""
    model, tok = tiny
    eager, _, _ = asyncio.run(run(copy.deepcopy(model), tok, False))

    def refuse(self, kv, b):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(StaticDecode, "_capture", refuse)
    monkeypatch.setattr(StaticDecode, "__init__", _capturing_init(StaticDecode.__init__))
    with pytest.warns(UserWarning, match="decoding without graphs"):
        after, _, step = asyncio.run(run(copy.deepcopy(model), tok, True))
    assert step.capture and "not permitted" in step.broken
    assert [r[0] + r[2] for r in after] == [r[0] + r[2] for r in eager]


def _capturing_init(init):
    def wrapped(self, model, device, max_rows, capture):
        init(self, model, device, max_rows, capture=True)  # as on a GPU: capture asked for

    return wrapped


def test_under_bf16_autocast_keys_and_values_keep_their_own_dtypes(model):
    """Under bf16 autocast the values come out bf16 and the keys, rotated by fp32 cos/sin, fp32
    (transformers 5.24): each buffer takes its own dtype, and the static step decodes as the eager
    one does (this failed on a GPU before: an index write refuses mixed dtypes)."""
    from rstar2.engines.batch import RunningBatch

    def decode(graphs: bool) -> list[torch.Tensor]:
        batch = RunningBatch(model, torch.device("cpu"), 4, 0, None, collections.Counter(), graphs)
        g, kv, out = batch.static_decode, batch.kv, []
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
            kv.add([None, None], ["a", "b"])
            logits = batch.forward(torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]]), kv, (0, 2), [4, 2])
            for _ in range(3):
                ids = logits.argmax(-1).tolist()
                if g is not None:
                    logits = g.decode(kv, ids, 0)
                else:
                    logits = batch.forward(torch.tensor(ids).unsqueeze(1), kv, (0, 2), [1, 1])
                out.append(logits.float())
        assert kv.buf_k[0].dtype == torch.float32 and kv.buf_v[0].dtype == torch.bfloat16
        return out

    for eager, static in zip(decode(False), decode(True), strict=True):
        assert torch.allclose(eager, static, atol=0.05)


def test_weights_written_in_place_keep_the_graphs_and_replaced_ones_drop_them(model):
    """The graphs read the parameters where they live: an in-place write (an optimizer step) keeps
    them; a parameter replaced by a new tensor drops them all (captured again when next needed)."""
    step = StaticDecode(model, torch.device("cpu"), 8, capture=False)
    step.captured[8] = ("a recorded graph", torch.zeros(1))
    with torch.no_grad():
        next(model.parameters()).mul_(1.5)
    step.weights_changed()
    assert 8 in step.captured
    name, param = next(model.named_parameters())
    module_name, _, attr = name.rpartition(".")
    setattr(model.get_submodule(module_name), attr, torch.nn.Parameter(param.detach().clone()))
    step.weights_changed()
    assert step.captured == {}
