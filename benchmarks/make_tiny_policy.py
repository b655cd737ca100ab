"""Writes ``benchmarks/tiny_policy/``: a policy that has just learned the tiny recipe's format
and its skill of copying numbers, the start of ``tiny_learning.py``'s RL stage.

The tiny recipe's SFT stage at a size that trains in about a minute (two layers, batches of 32,
operands of 1-2 digits), stopped once its chance of writing a clean demonstration word for word
reaches 0.2 (``stop_skill``): a model that solves some problems sampled at T = 1 and not others,
where RL has a signal. Run it again (``python benchmarks/make_tiny_policy.py``) after a change
to the tiny tokenizer or the chat format.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import yaml

from rstar2.recipe.run import run_recipe
from rstar2.recipe.spec import find_recipe, parse_recipe

HERE = Path(__file__).parent
OUT = HERE / "tiny_policy"
KEEP = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


def sft_recipe() -> dict:
    tree = yaml.safe_load(find_recipe("tiny").read_text())
    tree["model"].update(layers=2)
    tree["defaults"]["sft"]["run"].update(batch_size=32)
    tree["defaults"]["sft"]["optim"].update(schedule="constant")
    sft = tree["stages"][0]
    sft["data"]["generator"].update(digits=[1, 2], count=2000)
    sft["sft"]["probe"]["generator"].update(digits=[1, 2], count=64)
    sft.update(run={"steps": 800})
    sft["sft"]["stop_skill"] = 0.2
    tree["stages"] = [sft]
    return tree


def main() -> None:
    recipe = parse_recipe(sft_recipe())
    with tempfile.TemporaryDirectory() as tmp:
        run_recipe(recipe, Path(tmp) / "run", progress=True)
        ckpt = max((Path(tmp) / "run" / "01-sft" / "checkpoints").glob("step-*"))
        shutil.rmtree(OUT, ignore_errors=True)
        OUT.mkdir()
        for name in KEEP:
            if (ckpt / name).exists():
                shutil.copy(ckpt / name, OUT / name)
        print(f"{OUT}: from {ckpt.name}", file=sys.stderr)


if __name__ == "__main__":
    main()
