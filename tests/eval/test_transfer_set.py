"""The `transfer` set: reproducible, answers that its own programs compute, and kept apart from
training (never imported by training code; its wordings and number patterns absent from the
training data: tests/recipe/test_relations.py checks the latter against the new families)."""

import ast
import json
import subprocess
import sys
from pathlib import Path

from rstar2.eval import transfer_set
from rstar2.problems import DATA_DIR, load_benchmark

SRC = Path(transfer_set.__file__).parents[1]


def test_the_shipped_file_is_the_modules_output_and_its_programs_compute_its_answers():
    rows = load_benchmark("transfer")
    text = (DATA_DIR / "transfer.jsonl").read_text()
    assert text == "".join(json.dumps(r) + "\n" for r in transfer_set.build())
    assert len(rows) == 96 and len({r["kind"] for r in rows}) == 12
    assert len({r["problem"] for r in rows}) == len(rows)
    printed = subprocess.run(
        [sys.executable, "-c", "\n".join(r["code"] for r in rows)], capture_output=True, text=True, check=True
    ).stdout
    assert printed.split() == [r["answer"] for r in rows]


def test_no_training_code_imports_it():
    """Neither by name in any module outside eval/ nor at run time when training starts."""
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.parent.name == "eval":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any("transfer_set" in n for n in names):
                offenders.append(str(path))
    assert not offenders
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, rstar2.recipe.run, rstar2.recipe.tasks, rstar2.recipe.relations, "
            "rstar2.recipe.sft_data, rstar2.rl.trainer, rstar2.rl.sft, rstar2.eval.harness; "
            "print('rstar2.eval.transfer_set' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert loaded.strip() == "False"
