"""Does the tiny recipe still learn? Its first RL stage, run from a policy that has just learned the
format (``benchmarks/tiny_policy/``, written by ``make_tiny_policy.py``), against that policy: held-out
accuracy before and after, the change paired over problems never trained on, with its 95% interval.
A change that breaks learning (the loss, the advantages, the masks, RoC, the weights reaching the
sampler) shows here without running the demo. A benchmark, not a test: what 15 steps of a tiny
model learn depends on the machine's floats (the suite checks the mechanisms).

    python benchmarks/tiny_learning.py [--out runs/tiny-learning]      # ~1 minute
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import yaml

from rstar2.recipe.report_card import accuracy_in, eval_dir, paired_change
from rstar2.recipe.run import run_recipe
from rstar2.recipe.spec import find_recipe, parse_recipe

POLICY = Path(__file__).parent / "tiny_policy"


def rl_recipe() -> dict:
    """The tiny recipe's first RL stage, as it is but on the policy's problems (operands of 1-2
    digits), and held-out problems of that kind."""
    tree = yaml.safe_load(find_recipe("tiny").read_text())
    tree["model"] = {"path": str(POLICY), "device": "cpu", "compute": "fp32", "threads": 1}
    rl = tree["stages"][1]
    rl["data"]["generator"].update(digits=[1, 2])
    tree["stages"] = [rl]
    tree["eval"].update(count=128, samples=2, before=True, entropy_trajectories=0)
    return tree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/tiny-learning"))
    args = ap.parse_args()
    tree = rl_recipe()
    run_recipe(parse_recipe(tree), args.out, progress=False, log=lambda s: None)
    state = json.loads((args.out / "recipe_state.json").read_text())
    name = tree["stages"][0]["name"]
    before, after = (accuracy_in(eval_dir(args.out, n, label)) for n, label in ((0, "start"), (1, name)))
    change, half, problems = paired_change(before, after)
    print(f"\nThe tiny recipe's {name} from {POLICY.name}; CPU {torch.backends.cpu.get_cpu_capability()}\n")
    print("| held-out before | after | change (paired) | problems | learns |")
    print("|---:|---:|---:|---:|---|")
    print(
        f"| {state['evals']['start']['pass@1']:.1%} | {state['evals'][name]['pass@1']:.1%} "
        f"| {change * 100:+.1f} ± {half * 100:.1f} | {problems} | {'yes' if change - half > 0 else 'NO'} |"
    )


if __name__ == "__main__":
    main()
