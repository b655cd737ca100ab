"""What keeping servers on the trainer's policy costs a step: the weight push and its checks.

Starts ``--servers`` ``rstar2 serve`` processes on ``--model`` and publishes the model's weights to
them as the trainer does after each update (``rl/run/sync.py``'s ``publish``: the model folder written
off the event loop, every server loading it as the new version, each server's stated version and
fingerprint checked, then the sampled probe), ``--repeat`` times. The baseline, in the same run,
is the push as it was before issue 21: the servers told one after another, the folder written on
the event loop, the same checks and probe. ``benchmarks/async_rl.py``'s ``start_server`` pins
every server to core 0 (one thread), so on 2 cores their loads share it. Components are timed
apart (writing the folder, the loads, the fingerprint check, the probe), and the per-token version
check (``check_versions``) on a step of ``--rollouts`` trajectories of ``--tokens`` model tokens,
and the trainer's ban of ``rollout.banned_tokens`` on one micro-batch's log-probs against no ban.

    python benchmarks/weight_push.py --model /tmp/smollm2 [--servers 2] [--repeat 3] [--out results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from rstar2.config import EngineSection
from rstar2.engines.openai import OpenAIEngine
from rstar2.rl.algorithm.staleness import check_versions
from rstar2.rl.run import distributed as D
from rstar2.rl.run.sync import (
    check_fingerprint,
    load_into_servers,
    probe_engines,
    publish,
    reload_server,
    saved_tensors,
)
from rstar2.rollout.trajectory import Trajectory, Turn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from async_rl import start_server  # noqa: E402 (rstar2 serve on core 0, one thread)


async def timed(fn) -> float:
    t0 = time.perf_counter()
    await fn()
    return time.perf_counter() - t0


async def measure(model_dir: Path, servers: int, repeat: int) -> dict[str, list[float]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    procs = [start_server(model_dir, 8) for _ in range(servers)]
    engines = [OpenAIEngine(url) for _, url in procs]
    settings = EngineSection(servers=[url for _, url in procs])
    out: dict[str, list[float]] = {}
    folder = Path(tempfile.mkdtemp(prefix="rstar2-push-"))
    weights = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    probe = list(range(100, 140))
    try:
        version = 0
        for _ in range(repeat):
            version += 1

            async def sequential(v=version):  # before issue 21: one server after another, on the loop
                model.save_pretrained(folder, state_dict=weights)
                for e in engines:
                    answer = await reload_server(e, folder, settings, v)
                    check_fingerprint(e.name, answer, saved_tensors(folder, weights))
                await probe_engines(engines, model, probe, D.World(), pad_id=0, seed=v)

            version += 1
            out.setdefault("publish, servers one after another (before)", []).append(await timed(sequential))

            async def parallel(v=version):
                await publish(
                    model,
                    engines,
                    settings,
                    D.World(),
                    folder,
                    in_place=False,
                    probe_prompt=probe,
                    pad_id=0,
                    step=v,
                )

            out.setdefault("publish: push to all at once + checks + probe", []).append(await timed(parallel))
            version += 1
            save = await timed(lambda: asyncio.to_thread(model.save_pretrained, folder, state_dict=weights))
            out.setdefault("  writing the model folder", []).append(save)
            loads = await timed(
                lambda v=version: load_into_servers(engines, folder, settings, weights, version=v)
            )
            out.setdefault("  loads + stated version + fingerprint", []).append(loads)
            fp = await timed(lambda: asyncio.to_thread(saved_tensors, folder, weights))
            out.setdefault("    of which the trainer's side of the fingerprint", []).append(fp)
            probe_s = await timed(
                lambda v=version: probe_engines(engines, model, probe, D.World(), pad_id=0, seed=v)
            )
            out.setdefault("  the sampled probe", []).append(probe_s)
    finally:
        for e in engines:
            await e.close()
        for proc, _ in procs:
            proc.terminate()
            proc.wait(30)
    return out


def version_check_s(rollouts: int, tokens: int, repeat: int) -> float:
    """Seconds of ``check_versions`` on one step's trajectories (3 turns each)."""
    per_turn = tokens // 3
    trajs = []
    for _ in range(rollouts):
        t = Trajectory("p", "1", [1])
        for _ in range(3):
            t.turns.append(Turn("x", per_turn, tool_tokens=20, engine="http://e:1"))
            t.versions += [4] * per_turn + [-1] * 20
            t.loss_mask += [1] * per_turn + [0] * 20
        trajs.append(t)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        check_versions(trajs, trained_by=5, max_staleness=1)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def ban_cost_s(tokens: int, vocab: int, banned: int, repeat: int) -> tuple[float, float]:
    """Seconds of ``token_logprobs`` (with entropy, forward and backward) over one micro-batch's
    fp32 logits, without and with ``banned`` ids left out: what the trainer's ban adds a pass."""
    from rstar2.rl.algorithm.grpo import token_logprobs

    labels = torch.randint(0, vocab, (1, tokens))
    ban = torch.arange(banned)
    out = []
    for ids in (None, ban):
        times = []
        for _ in range(repeat):
            logits = torch.randn(1, tokens, vocab, requires_grad=True)
            t0 = time.perf_counter()
            logp, entropy = token_logprobs(logits, labels, True, temperature=1.0, banned=ids)
            (logp.sum() + entropy.sum()).backward()
            times.append(time.perf_counter() - t0)
        out.append(statistics.median(times))
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="a model folder (e.g. SmolLM2 imported)")
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rollouts", type=int, default=64, help="trajectories a step (version check)")
    ap.add_argument("--tokens", type=int, default=768, help="model tokens a trajectory (version check)")
    ap.add_argument("--out", type=Path, default=None, help="write the raw numbers as JSON")
    a = ap.parse_args()
    raw = asyncio.run(measure(a.model, a.servers, a.repeat))
    raw["check_versions, one step"] = [version_check_s(a.rollouts, a.tokens, 5)]
    plain, banned = ban_cost_s(1024, 49152, 2, 5)  # SmolLM2's micro-batch and vocabulary, its 2 bans
    raw["log-probs of a 1,024-token micro-batch (fwd+bwd), no ban"] = [plain]
    raw["the same, 2 banned ids left out"] = [banned]
    base = statistics.median(raw["publish, servers one after another (before)"])
    cap = torch.backends.cpu.get_cpu_capability()
    table = Table(title=f"weight push to {a.servers} rstar2 serve, {a.model.name} (CPU {cap})")
    for col in ("what", "median s", "× its baseline"):
        table.add_column(col)
    for name, values in raw.items():
        med = statistics.median(values)
        ratio = (
            med / base if name.startswith("publish") else med / plain if name.startswith("the same") else None
        )
        table.add_row(name, f"{med:.4f}", f"{ratio:.2f}" if ratio is not None else "")
    Console().print(table)
    if a.out:
        a.out.write_text(
            json.dumps({"cpu": cap, "servers": a.servers, "model": str(a.model), **raw}, indent=1)
        )


if __name__ == "__main__":
    main()
