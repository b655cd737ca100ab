"""The tiny recipe still learns: its first RL stage, run from a policy that has just learned the
format (``tiny_policy/``, written by ``make_tiny_policy.py``), raises held-out accuracy by more
than the 95% interval of the change, paired over problems never trained on. A change that breaks
learning (the loss, the advantages, the masks, RoC, the weights reaching the sampler) fails here
without running the demo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
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


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_rl_raises_held_out_accuracy_beyond_its_interval(tmp_path):
    tree = rl_recipe()
    out = tmp_path / "run"
    run_recipe(parse_recipe(tree), out, progress=False, log=lambda s: None)
    state = json.loads((out / "recipe_state.json").read_text())
    name = tree["stages"][0]["name"]
    before, after = (accuracy_in(eval_dir(out, n, label)) for n, label in ((0, "start"), (1, name)))
    change, half, problems = paired_change(before, after)
    assert problems == 128
    assert change - half > 0, (
        state["evals"]["start"]["pass@1"],
        state["evals"][name]["pass@1"],
        change,
        half,
    )
