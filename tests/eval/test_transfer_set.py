"""The `transfer` set: reproducible, answers that its own programs compute, and kept apart from
training (its generator, scripts/make_transfer_set.py, outside the package and imported by none of
it; its wordings and number patterns absent from the training data: tests/recipe/test_relations.py
checks the latter against the relation families)."""

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from rstar2.problems import DATA_DIR, load_problems

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "rstar2"
_spec = importlib.util.spec_from_file_location("make_transfer_set", ROOT / "scripts" / "make_transfer_set.py")
transfer_set = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(transfer_set)


def test_the_shipped_file_is_the_scripts_output_and_its_programs_compute_its_answers():
    rows = load_problems("transfer")
    text = (DATA_DIR / "transfer.jsonl").read_text()
    assert text == "".join(json.dumps(r) + "\n" for r in transfer_set.build())
    assert len(rows) == 96 and len({r["kind"] for r in rows}) == 12
    assert len({r["problem"] for r in rows}) == len(rows)
    printed = subprocess.run(
        [sys.executable, "-c", "\n".join(r["code"] for r in rows)], capture_output=True, text=True, check=True
    ).stdout
    assert printed.split() == [r["answer"] for r in rows]


def test_no_package_code_imports_its_generator():
    offenders = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any("transfer_set" in n for n in names):
                offenders.append(str(path))
    assert not offenders
