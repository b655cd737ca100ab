"""Every step of a recipe's RL stages redone by ``rstar2 replay``: bit for bit or not, per arm.

    python benchmarks/replay_recipe.py [--recipe tiny] [--out runs/replay-tiny] \
        [--arms in-process-k0,in-process-k1,serve-k0,serve-k1]

The recipe runs once whole with ``run.keep_steps`` (arm one), its evaluations cut to the final one;
every other arm continues from arm one's SFT checkpoint with its RL stages only: ``k1`` is
``asynchronous.max_staleness: 1`` (with ``loss.tis_cap: 2``), ``serve`` samples on an ``rstar2 serve``
started for the arm (which loads each stage's weights as the recipe goes). After each arm, every RL
stage is replayed from its first step to its last; the table says, per stage, how many steps were
redone and whether every weight, optimizer tensor and metric is the run's, bit for bit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml
from rich.console import Console
from rich.table import Table

from rstar2.local_service import free_port, wait_healthy
from rstar2.recipe.run import prepare_model, run_recipe
from rstar2.recipe.spec import find_recipe, parse_recipe
from rstar2.rl.replay import replay
from rstar2.rl.run.keep import kept_steps

CUT_EVALS = {"before": False, "plain_before": False, "heldout_at": [], "entropy_trajectories": 0, "count": 32}


def arm_tree(base: dict, arm: str) -> dict:
    tree = json.loads(json.dumps(base))
    tree["eval"] |= CUT_EVALS
    rl = tree["defaults"].setdefault("rl", {})
    rl.setdefault("run", {})["keep_steps"] = True
    if arm.endswith("k1"):
        rl["asynchronous"] = {"max_staleness": 1}
        rl.setdefault("loss", {})["tis_cap"] = 2.0
    return tree


def serve(model: Path, weights_from: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    args = [
        "serve",
        "--model",
        str(model),
        "--port",
        str(port),
        "--device",
        "cpu",
        "--weights-from",
        str(weights_from),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rstar2", *args], stdout=log.open("w"), stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, timeout_s=300, what="rstar2 serve")
    return proc, url


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="tiny")
    ap.add_argument("--out", type=Path, default=Path("runs/replay-tiny"))
    ap.add_argument("--arms", default="in-process-k0,in-process-k1,serve-k0,serve-k1")
    args = ap.parse_args(argv)
    base = yaml.safe_load(find_recipe(args.recipe).read_text())
    arms = args.arms.split(",")
    rows = []
    first = args.out / arms[0]
    for arm in arms:
        folder = args.out / arm
        tree = arm_tree(base, arm)
        recipe = parse_recipe(tree)
        if folder != first and not folder.exists():  # from arm one's SFT: its model and checkpoint
            folder.mkdir(parents=True)
            for name in ("model-init", "01-sft"):
                shutil.copytree(first / name, folder / name, symlinks=True)
            state = json.loads((first / "recipe_state.json").read_text())
            sft = state["stages"]["sft"]
            sft["checkpoint"] = str(folder / Path(sft["checkpoint"]).relative_to(first))
            state |= {"stages": {"sft": sft}, "evals": {}, "also": {}}
            (folder / "recipe_state.json").write_text(json.dumps(state))
        server = None
        if arm.startswith("serve"):
            init = prepare_model(recipe, folder)
            server, url = serve(init, args.out, folder.with_suffix(".serve.log"))
            tree["rollout"].setdefault("engine", {})["servers"] = [url]
            recipe = parse_recipe(tree)
        t0 = time.perf_counter()
        try:
            print(f"[bench] {arm}", file=sys.stderr, flush=True)
            run_recipe(recipe, folder, resume=folder.exists() and any(folder.iterdir()), progress=False)
        finally:
            if server is not None:
                server.terminate()
                server.wait(60)
        run_s = time.perf_counter() - t0
        for n, stage in enumerate(recipe.stages, 1):
            if stage.kind != "rl":
                continue
            stage_dir = folder / f"{n:02d}-{stage.name}"
            steps = kept_steps(stage_dir)
            threads = torch.get_num_threads()
            t1 = time.perf_counter()
            try:
                again = replay(stage_dir, 1, steps[-1])
            finally:
                torch.set_num_threads(threads)
            rows.append(
                {
                    "arm": arm,
                    "stage": stage.name,
                    "steps": len(steps),
                    "redone": len(again.steps),
                    "bit_for_bit": again.first_difference is None and all(s.bit_for_bit for s in again.steps),
                    "first_difference": again.first_difference and again.first_difference.step,
                    "replay_s": time.perf_counter() - t1,
                    "arm_s": run_s,
                }
            )
    table = Table(
        title=f"rstar2 replay, every RL step of the {args.recipe} recipe ({torch.backends.cpu.get_cpu_capability()})"
    )
    for col in ("arm", "stage", "steps kept", "steps redone", "bit for bit", "replay s"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["arm"],
            r["stage"],
            str(r["steps"]),
            str(r["redone"]),
            "yes" if r["bit_for_bit"] else f"no (step {r['first_difference']})",
            f"{r['replay_s']:.0f}",
        )
    Console().print(table)
    (args.out / "replay-recipe.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
