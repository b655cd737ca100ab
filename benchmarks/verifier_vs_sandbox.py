"""Answer checks that need the CAS: rstar2's ``VerifierPool`` (warm checker processes reused, a
CPU-time box) against the same checks run as sandbox calls (``SandboxVerifier`` over a ``LocalPool``
with the CAS preloaded: one forked, isolated child per check), measured in the same run, ABAB.

    python benchmarks/verifier_vs_sandbox.py [--pairs 300] [--workers 2]

The question it answers (issue 18): could the verifier's own process pool be dropped for the
sandbox's? Pairs: MATH-500 and HMMT references, each against itself plus one (a wrong answer the
fast path cannot decide), kept only where the fast path defers to the CAS.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from rstar2.problems import load_problems
from rstar2.reward import SandboxVerifier, VerifierPool, triage
from rstar2.sandbox.local_pool import LocalPool


def cas_pairs(n: int) -> list[tuple[str, str]]:
    pairs = []
    for row in load_problems("math500") + load_problems("hmmt_feb_2025"):
        ref = str(row["answer"])
        for answer in (ref, ref + "+1"):
            response = f"<answer>\\boxed{{{answer}}}</answer>"
            if triage(ref, response, mode="strict")[0] is None:
                pairs.append((ref, response))
    return pairs[:n]


def run_pool(pairs, workers):
    with VerifierPool(workers, timeout_s=10.0) as pool:
        pool.map(pairs[:8])  # warm
        t0 = time.perf_counter()
        verdicts = pool.map(pairs)
        return time.perf_counter() - t0, verdicts


async def run_sandbox(pairs, workers):
    async with LocalPool(workers=workers, preload=["default", "rstar2.reward.equivalence"]) as sandbox:
        verifier = SandboxVerifier(sandbox, timeout_s=10.0)
        await verifier.check_many(pairs[:8])  # warm
        t0 = time.perf_counter()
        verdicts = await verifier.check_many(pairs)
        return time.perf_counter() - t0, verdicts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=300)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    pairs = cas_pairs(args.pairs)
    times: dict[str, list[float]] = {"VerifierPool": [], "sandbox calls": []}
    answers: dict[str, list[bool]] = {}
    for name in ("VerifierPool", "sandbox calls") * 2:
        if name == "VerifierPool":
            seconds, verdicts = run_pool(pairs, args.workers)
        else:
            seconds, verdicts = asyncio.run(run_sandbox(pairs, args.workers))
        times[name].append(seconds)
        answers[name] = [v.correct for v in verdicts]
    base = statistics.mean(times["VerifierPool"])
    table = Table(
        title=f"{len(pairs)} CAS checks, {args.workers} workers "
        f"(CPU {torch.backends.cpu.get_cpu_capability()}; two runs each, ABAB)"
    )
    for col in ("path", "pairs/s", "× VerifierPool", "same verdicts"):
        table.add_column(col, justify="left" if col == "path" else "right")
    for name, ts in times.items():
        mean = statistics.mean(ts)
        same = sum(a == b for a, b in zip(answers[name], answers["VerifierPool"], strict=True))
        table.add_row(name, f"{len(pairs) / mean:.1f}", f"{base / mean:.3f}×", f"{same}/{len(pairs)}")
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
