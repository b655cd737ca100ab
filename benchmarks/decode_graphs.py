"""The in-process engine's decode step eager against replayed as CUDA graphs (engines/graphs.py).

For each batch size, a fresh engine decodes that many of a recipe's prompts at once, ``--new``
tokens each (end-of-sequence banned: every row runs its full length), after a warm-up of the whole
batch: eager (``cuda_graphs=False``) and with graphs (``True``), in the order eager, graphs,
graphs, eager (``--repeat 2``), in one process. The table shows model tokens/s, one decode step's
milliseconds and their ratio; then whether greedy decoding gives the same tokens both ways.

    python benchmarks/decode_graphs.py --model <a model folder> --rows 1,8,64 --out results.json

On a CPU "graphs" is their static step run eagerly (no capture exists there): what it costs to
pad rows to a bucket and attend over every column, the reason the default is off on a CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from async_rl import engine_inputs, engine_rate, problems, tiny_model  # noqa: E402


def greedy_agreement(net, prompts: list[list[int]], new: int) -> dict:
    """Greedy tokens of ``prompts`` eager and with graphs: the share of rows identical throughout,
    and the mean share of tokens before the first difference (bf16 rounding may split a tie)."""
    from rstar2.engines.base import SamplingParams
    from rstar2.engines.hf import HFEngine

    async def run(graphs: bool) -> list[list[int]]:
        engine = HFEngine(net, max_batch_size=len(prompts), cuda_graphs=graphs)
        try:
            params = SamplingParams(max_new_tokens=new, temperature=0.0)
            gens = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
            return [g.token_ids for g in gens]
        finally:
            await engine.close()

    eager, graphs = asyncio.run(run(False)), asyncio.run(run(True))
    same = [a == b for a, b in zip(eager, graphs, strict=True)]

    def prefix(a: list[int], b: list[int]) -> float:
        n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        return n / max(1, max(len(a), len(b)))

    return {
        "rows_identical": sum(same) / len(same),
        "prefix_share": statistics.fmean(prefix(a, b) for a, b in zip(eager, graphs, strict=True)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="a model folder (default: the tiny shape)")
    ap.add_argument(
        "--recipe", default=None, help="whose chat format (default: tiny, or smollm2-135m with --model)"
    )
    ap.add_argument("--device", default="auto", help="cpu, cuda (auto: CUDA when present)")
    ap.add_argument("--rows", default="1,8,64", help="batch sizes")
    ap.add_argument("--new", type=int, default=128, help="new tokens a row")
    ap.add_argument("--repeat", type=int, default=2, help="1: eager, graphs; 2: eager, graphs, graphs, eager")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    recipe = a.recipe or ("smollm2-135m" if a.model else "tiny")
    sizes = [int(r) for r in a.rows.split(",")]
    order = [False, True] + ([True, False] if a.repeat > 1 else [])
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model or tiny_model(Path(tmp))
        data = problems(Path(tmp), max(sizes))
        net, prompts, stop = engine_inputs(model, data, max(sizes), recipe, a.device)
        device = next(net.parameters()).device
        for rows in sizes:
            for graphs in order:
                r = engine_rate(net, prompts[:rows], a.new, stop, cuda_graphs=graphs)
                results.append({"rows": rows, "graphs": graphs, **r})
                print(f"rows {rows} graphs {graphs}: {r['tokens_per_s']:.1f} tokens/s", flush=True)
        agreement = greedy_agreement(net, prompts[: min(8, max(sizes))], min(a.new, 64))
    where = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads"
    )
    table = Table(
        title=f"decode step, eager vs CUDA graphs ({model.name}; {where}; {a.new} new tokens a row)"
    )
    for c in ("rows", "eager tokens/s", "graphs tokens/s", "× eager", "eager step ms", "graphs step ms"):
        table.add_column(c, justify="right")
    for rows in sizes:
        e = [r for r in results if r["rows"] == rows and not r["graphs"]]
        g = [r for r in results if r["rows"] == rows and r["graphs"]]
        et, gt = (statistics.fmean(r["tokens_per_s"] for r in x) for x in (e, g))
        es, gs = (1000 * statistics.fmean(r["decode_step_s"] for r in x) for x in (e, g))
        table.add_row(str(rows), f"{et:.1f}", f"{gt:.1f}", f"{gt / et:.2f}×", f"{es:.2f}", f"{gs:.2f}")
    Console(width=140).print(table)
    print(
        f"greedy, eager vs graphs: {100 * agreement['rows_identical']:.0f}% of rows identical, "
        f"{100 * agreement['prefix_share']:.0f}% of tokens before the first difference"
    )
    if a.out:
        a.out.write_text(
            json.dumps(
                {
                    "runs": results,
                    "greedy": agreement,
                    "where": where,
                    "args": {k: str(v) for k, v in vars(a).items()},
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
