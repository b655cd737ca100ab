"""The CUDA paths, marked ``gpu``: left out of the default run (CI has no GPU to lend) and run with
``pytest -m gpu`` where a GPU is (they passed on an H100, 2026-11-26); without one they fail."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rstar2.device import resolve_precision
from rstar2.engines.base import SamplingParams
from rstar2.engines.hf import HFEngine

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def cuda_present():
    """Asked for (``-m gpu``) on a machine without a GPU: a clear failure, not a skip."""
    assert torch.cuda.is_available(), "the gpu tests need a CUDA device (run them with -m gpu where one is)"


def test_fp32_weights_sample_under_bf16_autocast_and_logprobs_stay_close(tiny):
    model, tok = tiny
    gpu = type(model)(model.config).to("cuda")
    gpu.load_state_dict(model.state_dict())
    assert resolve_precision("cuda").resolved == "bf16"  # the GPUs lent here all compute bf16

    async def sample():
        eng = HFEngine(gpu, max_batch_size=8)
        try:
            p = tok.encode("question number 3: xx", add_special_tokens=False)
            return p, await eng.generate(p, SamplingParams(max_new_tokens=24, temperature=1.0, seed=0))
        finally:
            await eng.close()

    p, g = asyncio.run(sample())
    assert len(g.token_ids) == 24
    with torch.no_grad():  # the fp32 teacher-forced pass on CPU: bf16 sampling differs only by rounding
        logits = model(torch.tensor([p + g.token_ids])).logits[0].float()
    ref = logits.log_softmax(-1)[len(p) - 1 : -1].gather(1, torch.tensor(g.token_ids)[:, None]).squeeze(1)
    assert (ref - torch.tensor(g.logprobs)).abs().max() < 0.1


def test_an_rl_run_on_cuda_trains_and_checkpoints(tiny_dir, tmp_path):
    """The trainer through the real CLI on CUDA: fp32 master weights, bf16 autocast in the update
    and in the in-process engine that shares them; the saved weights moved."""
    import json

    import yaml
    from safetensors.torch import load_file

    from rstar2.rl.run.checkpoint import latest_checkpoint

    from ..rl.test_scale_out import cli, ok
    from ..rl.test_trainer import rl_config

    rows = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(8)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = rl_config(tiny_dir, tmp_path / "train.jsonl", tmp_path / "run")
    cfg["model"]["device"] = "cuda"
    cfg["rollout"]["engine"]["max_batch_size"] = 16
    cfg["run"]["steps"] = 2
    (tmp_path / "rl.yaml").write_text(yaml.safe_dump(cfg))
    ok(cli(["train", str(tmp_path / "rl.yaml")]))
    last = latest_checkpoint(tmp_path / "run")
    after = load_file(str(last / "model.safetensors"))
    before = load_file(str(tiny_dir / "model.safetensors"))
    moved = max((after[k].float() - before[k].float()).abs().max().item() for k in after if k in before)
    assert moved > 1e-4


def test_cuda_graphs_replay_the_eager_decode_and_see_weights_written_in_place(tiny):
    """One engine replaying its decode step as CUDA graphs and one decoding eagerly, each kept
    across in-place weight changes (an optimizer step's kind of write) and an ``invalidate``: the
    graphs, captured once, replay the new weights, and the greedy tokens equal the eager ones."""
    model, tok = tiny
    gpu = type(model)(model.config).to("cuda")
    gpu.load_state_dict(model.state_dict())
    prompts = [tok.encode(f"question {i}: xx " * (1 + i % 3), add_special_tokens=False) for i in range(5)]
    params = SamplingParams(max_new_tokens=24, temperature=0.0)

    async def both():
        graphed = HFEngine(gpu, max_batch_size=8, cuda_graphs=True)
        eager = HFEngine(gpu, max_batch_size=8, cuda_graphs=False)

        async def greedy(eng):
            gens = await asyncio.gather(*(eng.generate(p, params) for p in prompts))
            return [g.token_ids for g in gens], [g.logprobs[0] for g in gens]

        try:
            seen = []
            for version in (1, 2, 3):
                (replayed, first), (plain, _) = await greedy(graphed), await greedy(eager)
                assert replayed == plain, version
                seen.append(first)
                if version == 1:
                    captures = graphed.static_decode.captures  # every bucket these prompts need
                with torch.no_grad():
                    for p in gpu.parameters():
                        p.add_(0.02 * torch.randn_like(p))
                if version == 2:  # a write announced by the trainer, as after each update
                    graphed.invalidate(version)
                    eager.invalidate(version)
            assert eager.static_decode is None and captures > 0
            assert (
                graphed.static_decode.captures == captures
            )  # replayed, not captured again, after each write
            assert seen[0] != seen[1] != seen[2]  # each round decoded under other weights
        finally:
            await graphed.close()
            await eager.close()

    asyncio.run(both())
