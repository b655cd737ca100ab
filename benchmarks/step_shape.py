"""How deep one RL step's update runs: the chain of rstar2 functions from the update's entry point to
the micro-batch loss and to ``optimizer.step()``, on a real step of the tiny model (issue 27).

    python benchmarks/step_shape.py                          # this tree
    PYTHONPATH=/path/to/other/checkout/src python benchmarks/step_shape.py   # another commit's

The RL trainer runs one step (the tiny model built here, the real code environment and verifier);
a profile hook records the stack each time ``grpo.policy_loss`` or the optimizer's ``step`` is
entered, keeps the frames of rstar2's own functions and prints them outermost first, with the length
of ``RLTrainer.step``'s body and the functions that step calls directly. Nothing is timed.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
import tempfile
import threading
from pathlib import Path

import torch

import rstar2

PACKAGE = Path(rstar2.__file__).resolve().parent


def build_model(root: Path) -> Path:
    from rstar2.recipe.spec import find_recipe, load_recipe
    from rstar2.recipe.tiny_model import build_model, build_tokenizer, save_pretrained, tiny_corpus

    recipe = load_recipe(find_recipe("tiny"))
    tok = build_tokenizer(tiny_corpus(recipe), 320)
    model = build_model(tok, hidden=32, layers=1, heads=2, mlp=64, max_positions=512)
    return save_pretrained(model, tok, root / "tiny")


def ours(frame) -> str | None:
    path = Path(frame.f_code.co_filename).resolve()
    if PACKAGE in path.parents:
        return f"{path.relative_to(PACKAGE).as_posix()}::{frame.f_code.co_qualname}"
    return None


def main() -> None:
    from rstar2.config_files import parse_config
    from rstar2.rl.trainer import RLTrainer

    chains: dict[str, list[str]] = {}

    def hook(frame, event, arg):
        if event != "call":
            return
        name = frame.f_code.co_name
        here = Path(frame.f_code.co_filename).name
        key = "policy_loss" if (name == "policy_loss" and here == "grpo.py") else None
        if frame.f_code.co_qualname in ("Adam.step", "AdamW.step"):
            key = "optimizer.step()"
        if key and key not in chains:
            stack = [ours(f.frame) for f in reversed(inspect.stack()[1:])]
            chains[key] = [s for s in stack if s]

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = build_model(root)
        rows = [{"problem": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(4) for b in range(4)]
        (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        cfg = parse_config(
            {
                "kind": "rl",
                "model": {"path": str(model), "threads": 1, "compute": "fp32"},
                "data": {"train": str(root / "train.jsonl")},
                "rollout": {
                    "samples": 4,
                    "max_turns": 2,
                    "max_response_tokens": 24,
                    "temperature": 1.0,
                    "system_prompt": "",
                    "user_prefix": "",
                    "tools_in_prompt": False,
                },
                "roc": {"keep": 2},
                "run": {"out": str(root / "run"), "steps": 1, "batch_size": 2, "progress": False},
            }
        )
        threading.setprofile(hook)
        sys.setprofile(hook)
        try:
            asyncio.run(RLTrainer(cfg, reward_fn=lambda t: float(sum(t.response_ids) % 2)).train())
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
    source = inspect.getsource(RLTrainer.step)
    body = [line for line in source.splitlines() if line.strip()]
    print(f"rstar2 at {PACKAGE} (torch {torch.__version__})")
    print(f"RLTrainer.step: {len(body)} non-blank lines, docstring included")
    for key, chain in chains.items():
        print(f"\n{key}: {len(chain)} rstar2 frames on its thread's stack, outermost first")
        for frame in chain:
            print(f"  {frame}")


if __name__ == "__main__":
    main()
