"""``rstar2 verify``: one (reference, response) pair, or a file of them graded at once: reading
it, a verdict a line, and the summary of the verdicts, against labels where the file has them."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

from ..jsonl import iter_jsonl
from .equivalence import Verdict
from .verifier_pool import VerifierPool


def grade_one(reference: str, response: str, extracted: bool, workers: int | None, **pool: Any) -> Verdict:
    """One pair's verdict (``workers``, ``pool``: the ``VerifierPool``'s size, timeout_s and mode)."""
    with VerifierPool(workers, **pool) as checker:
        return checker.check(reference, response, extracted=extracted)


def grade_file(
    path: Path, output: Path | TextIO, extracted: bool, console: Any, workers: int | None, **pool: Any
) -> Any:
    """Every pair of ``path`` graded with a progress bar on ``console``, a verdict a line written
    to ``output`` (its label carried over); returns the summary as a rich ``Table``."""
    from rich.progress import Progress
    from rich.table import Table

    rows = read_pairs(path)
    with VerifierPool(workers, **pool) as checker, Progress(console=console, transient=True) as bar:
        task = bar.add_task("verifying", total=len(rows))
        pairs = [(r["reference"], r["response"]) for r in rows]
        verdicts = checker.map(pairs, extracted=extracted, on_done=lambda _v: bar.advance(task))
    lines = "".join(
        json.dumps({**v.to_dict(), **({"label": r["label"]} if "label" in r else {})}) + "\n"
        for r, v in zip(rows, verdicts, strict=True)
    )
    if isinstance(output, Path):
        output.write_text(lines)
    else:
        output.write(lines)
    table = Table(title="verify")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for measure, value in summary(rows, verdicts, checker.stats.timeouts):
        table.add_row(measure, value)
    return table


def read_pairs(path: Path) -> list[dict[str, Any]]:
    """Rows with ``reference`` and ``response`` (as text) and an optional ``label``."""
    rows = []
    for n, row in iter_jsonl(path):
        if not isinstance(row, dict) or "reference" not in row or "response" not in row:
            raise ValueError(f"{path}:{n}: needs the fields 'reference' and 'response'")
        rows.append({**row, "reference": str(row["reference"]), "response": str(row["response"])})
    return rows


def summary(rows: list[dict[str, Any]], verdicts: list, timeouts: int) -> list[tuple[str, str]]:
    """(measure, value) rows: counts, the paths that decided, and agreement with the labels."""
    n = len(verdicts)
    correct = sum(v.correct for v in verdicts)
    out = [("pairs", str(n)), ("judged correct", f"{correct} ({correct / max(n, 1):.1%})")]
    out += [(f"path {path}", str(count)) for path, count in sorted(Counter(v.path for v in verdicts).items())]
    out.append(("timeouts", str(timeouts)))
    labelled = [(bool(r["label"]), v.correct) for r, v in zip(rows, verdicts, strict=True) if "label" in r]
    if labelled:
        tp = sum(lab and got for lab, got in labelled)
        fp = sum(got and not lab for lab, got in labelled)
        fn = sum(lab and not got for lab, got in labelled)
        out += [
            ("accuracy vs label", f"{sum(lab == got for lab, got in labelled) / len(labelled):.2%}"),
            ("precision", f"{tp / max(tp + fp, 1):.4f}"),
            ("recall", f"{tp / max(tp + fn, 1):.4f}"),
            ("false positives", str(fp)),
        ]
    return out
