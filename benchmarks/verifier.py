"""Verifier benchmark: rstar2's reward against plain math-verify on the same labelled pairs.

    python benchmarks/verifier.py            # all shipped sets + 2,000 DAPO integer pairs
    python benchmarks/verifier.py --quick    # a few hundred pairs
    python benchmarks/verifier.py --categories-only   # the hand-written categories alone
    python benchmarks/verifier.py --mutations-only    # the mutation table alone

Pairs come from the evaluation sets' references: each is written the ways a model writes it
(label correct) and paired with wrong answers: a different reference, n+1, a x100 percent slip,
a decimal that only rounds alike (label wrong). Prints pairs/s, p50/p99 latency (one process,
one pair at a time), accuracy, precision and recall for (a) rstar2's fast path on the pairs it
decides, (b) rstar2's full path in-process, (c) ``math_verify.verify(parse(gold), parse(pred))``,
(d) rstar2's VerifierPool with one process per core. Ratios are against (c) in the same run.

A second table scores the hand-written categories of ``verifier_cases.py`` (answers in sentences,
units, relations, equations, matrices, several answers, float-precision decimals, thousands
separators): accuracy per category for rstar2 lenient (the prediction as given), rstar2 strict (bare
answers wrapped as ``<answer>\\boxed{…}</answer>``) and math-verify on the prediction as given.

A third table counts accepted mutants (``verifier_mutations.py``: every shipped gold answer changed
so that sympy confirms it is no longer equal) by kind: rstar2 strict (``<answer>\\boxed{m}</answer>``),
rstar2 lenient (the mutant as given) and math-verify (``verify(parse(gold), parse(\\boxed{m}))``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import sys
import time
from fractions import Fraction
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rstar2.problems import load_problems
from rstar2.reward import VerifierPool, check_answer, extract_answer, triage
from rstar2.reward.normalize import normalize, plain_number

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verifier_cases import CATEGORIES, is_free_form  # noqa: E402
from verifier_mutations import mutants  # noqa: E402

DAPO = Path(__file__).resolve().parents[2] / "shared" / "data" / "dapo_math_17k_en.jsonl"


def _response(answer: str, style: int) -> str:
    styles = [
        "<reason>Let me compute it.</reason>\n<answer>The final answer is $\\boxed{{{a}}}$.</answer>",
        "<reason>The tool printed the value; checking again it holds.</reason><answer>\\boxed{{{a}}}</answer>",
        "<answer>${a}$</answer>",
    ]
    return styles[style % len(styles)].format(a=answer)


def _rewrite(ref: str) -> str | None:
    """The same value written differently, or None."""
    num = plain_number(normalize(ref))
    if num is None or num.percent:
        return None
    v = num.value
    if v.denominator == 1:
        return f"x = {v.numerator}"
    if 10**6 % v.denominator == 0 or (2**20 * 5**20) % v.denominator == 0:
        return str(float(v)) if len(str(float(v))) < 12 else None
    return f"\\frac{{{v.numerator}}}{{{v.denominator}}}"


def _wrongs(refs: list[str], i: int) -> list[str]:
    ref = refs[i]
    out = []
    for step in range(7, 7 + len(refs)):
        other = refs[(i + step) % len(refs)]
        if normalize(other).replace(" ", "") != normalize(ref).replace(" ", ""):
            out.append(other)
            break
    num = plain_number(normalize(ref))
    if num is not None and not num.percent:
        v = num.value
        if v.denominator == 1:
            out.append(str(v.numerator + 1))
            if v != 0:
                out.append(str(v.numerator * 100))  # x100 percent slip
        else:
            out.append(f"{float(v):.4f}" if Fraction(f"{float(v):.4f}") != v else str(v + 1))  # rounds alike
    return out


# Hand-labelled pairs where rule-based graders are known to slip: (reference, answer, correct).
TRICKY = [
    ("1/3", "0.333333", False),
    ("\\frac13", "0.33", False),
    ("\\pi", "3.14", False),
    ("\\pi", "3.14159265", False),
    ("\\pi", "3.14159265358979", False),
    ("2\\pi", "6.28", False),
    ("50", "0.5", False),
    ("0.5", "50", False),
    ("12345678", "12345679", False),
    ("100", "100.0000001", False),
    ("\\text{Evelyn}", "Evenly", False),
    ("\\text{(C)}", "(D)", False),
    ("(3,4]", "[3,4]", False),
    ("(-\\infty, 0]", "(-\\infty,0)", False),
    ("(3,\\frac{\\pi}{2})", "(3,1.5708)", False),
    ("33", "33 or 34", False),
    ("33", "\\approx 33", False),
    ("33", "33?", False),
    ("33", "\\pm 33", False),
    ("p - q", "q-p", False),
    ("1,-2", "1,2", False),
    ("x=5", "x=6", False),
    ("e", "2.718", False),
    ("1500", "1.5e3", True),
    ("1500", "1.5\\times 10^{3}", True),
    ("10,\\!080", "10080", True),
    ("\\$32,\\!348", "32348", True),
    ("204", "204.", True),
    ("1\\frac{4}{5}", "1.8", True),
    ("50\\%", "50", True),
    ("0.5", "50\\%", True),
    ("90^\\circ", "90", True),
    ("5.4 \\text{ cents}", "5.4", True),
    ("\\text{(C)}", "C", True),
    ("\\text{Evelyn}", "Evelyn", True),
    ("x=5", "5", True),
    ("-5", "−5", True),
    ("\\frac{\\sqrt{3}}{3}", "\\frac{1}{\\sqrt3}", True),
    ("18+2\\pi", "2\\pi+18", True),
    ("\\{1\\pm\\sqrt{5},-2\\}", "-2, 1+\\sqrt5, 1-\\sqrt5", True),
    ("(3,4]", "(3, 4]", True),
    (
        "\\begin{pmatrix} -1/3 \\\\ 2/3 \\end{pmatrix}",
        "\\begin{pmatrix} -\\frac13 \\\\ \\frac23 \\end{pmatrix}",
        True,
    ),
    ("2^{25} \\cdot 26!", "26!\\cdot 2^{25}", True),
    ("52_8", "52_{8}", True),
    ("x \\in [-2,7]", "[-2,7]", True),
]


def build_pairs(quick: bool, dapo_n: int) -> list[dict]:
    rng = random.Random(0)
    pairs = [
        {"set": "tricky", "kind": "tricky", "reference": ref, "response": _response(ans, i), "label": label}
        for i, (ref, ans, label) in enumerate(TRICKY)
    ]
    sets = ["aime2024", "aime2025", "hmmt_feb_2025", "math500"]
    for name in sets:
        refs = [str(r["answer"]) for r in load_problems(name)]
        if quick:
            refs = refs[:60]
        for i, ref in enumerate(refs):
            kind = (
                "integer"
                if (n := plain_number(normalize(ref))) is not None and n.value.denominator == 1
                else "latex"
            )
            pairs.append(
                {"set": name, "kind": kind, "reference": ref, "response": _response(ref, i), "label": True}
            )
            alt = _rewrite(ref)
            if alt is not None:
                pairs.append(
                    {
                        "set": name,
                        "kind": kind,
                        "reference": ref,
                        "response": _response(alt, i + 1),
                        "label": True,
                    }
                )
            for w in _wrongs(refs, i):
                pairs.append(
                    {
                        "set": name,
                        "kind": kind,
                        "reference": ref,
                        "response": _response(w, i + 2),
                        "label": False,
                    }
                )
    if DAPO.exists() and dapo_n:
        rows = [json.loads(line) for line in DAPO.read_text().splitlines()[: dapo_n * 3]]
        for i, r in enumerate(rng.sample(rows, min(dapo_n, len(rows)))):
            ref = str(r["answer"])
            wrong = str(int(ref) + rng.choice([-2, -1, 1, 2])) if ref.lstrip("-").isdigit() else "0"
            pairs.append(
                {
                    "set": "dapo",
                    "kind": "integer",
                    "reference": ref,
                    "response": _response(ref, i),
                    "label": True,
                }
            )
            pairs.append(
                {
                    "set": "dapo",
                    "kind": "integer",
                    "reference": ref,
                    "response": _response(wrong, i),
                    "label": False,
                }
            )
    return pairs


def _scores(pairs: list[dict], got: list[bool]) -> dict:
    tp = sum(p["label"] and g for p, g in zip(pairs, got, strict=True))
    fp = sum(g and not p["label"] for p, g in zip(pairs, got, strict=True))
    fn = sum(p["label"] and not g for p, g in zip(pairs, got, strict=True))
    acc = sum(p["label"] == g for p, g in zip(pairs, got, strict=True)) / max(len(pairs), 1)
    return {"accuracy": acc, "precision": tp / max(tp + fp, 1), "recall": tp / max(tp + fn, 1), "fp": fp}


def _timed(fn, pairs: list[dict]) -> tuple[list[bool], list[float], float]:
    got, lat = [], []
    start = time.perf_counter()
    for p in pairs:
        t = time.perf_counter()
        got.append(bool(fn(p)))
        lat.append(time.perf_counter() - t)
    return got, lat, time.perf_counter() - start


def _row(name: str, pairs, got, lat, wall, base_rate=None, timeouts=0) -> dict:
    lat_sorted = sorted(lat) or [float("nan")]
    rate = len(pairs) / wall if wall else 0.0
    return {
        "method": name,
        "pairs": len(pairs),
        "pairs_per_s": rate,
        "ratio": rate / base_rate if base_rate else None,
        "p50_ms": 1000 * statistics.median(lat_sorted) if lat else None,
        "p99_ms": 1000 * lat_sorted[min(len(lat_sorted) - 1, int(0.99 * len(lat_sorted)))] if lat else None,
        "timeouts": timeouts,
        **_scores(pairs, got),
    }


def math_verify_baseline(p: dict) -> bool:
    from math_verify import parse, verify

    try:
        return verify(parse(f"${p['reference']}$"), parse(p["response"]))
    except Exception:  # noqa: BLE001
        return False


def ours_full(p: dict) -> bool:
    answer = extract_answer(p["response"])
    return answer is not None and check_answer(p["reference"], answer).correct


def ours_fast(p: dict) -> bool:
    return bool(triage(p["reference"], p["response"])[0])


def category_pairs() -> list[dict]:
    return [
        {"kind": kind, "reference": ref, "prediction": pred, "label": label, "free": is_free_form(pred)}
        for kind, cases in CATEGORIES.items()
        for ref, pred, label in cases
    ]


def _lenient(p: dict) -> bool:
    answer = extract_answer(p["prediction"], "lenient")
    return answer is not None and check_answer(p["reference"], answer).correct


def _strict(p: dict) -> bool:
    return ours_full(
        {"reference": p["reference"], "response": f"<answer>\\boxed{{{p['prediction']}}}</answer>"}
    )


def _math_verify_as_given(p: dict) -> bool:
    return math_verify_baseline({"reference": p["reference"], "response": p["prediction"]})


def category_table(console: Console) -> list[dict]:
    """Accuracy per hand-written category, rstar2 (lenient, strict) beside math-verify."""
    pairs = category_pairs()
    methods = {  # math-verify first: it pays the LaTeX parser's first-use costs, as in the main table
        "math-verify": (_math_verify_as_given, pairs),
        "rstar2 lenient": (_lenient, pairs),
        "rstar2 strict (bare answers)": (_strict, [p for p in pairs if not p["free"]]),
    }
    runs = {}
    for name, (fn, subset) in methods.items():
        got, lat, wall = _timed(fn, subset)
        runs[name] = (subset, got, lat, wall)
    base_rate = len(pairs) / runs["math-verify"][3]
    table = Table(title="Hand-written categories (benchmarks/verifier_cases.py): accuracy, n in brackets")
    table.add_column("category", justify="left")
    for name in methods:
        table.add_column(name, justify="right")
    rows = []
    for kind in [*CATEGORIES, "all"]:
        cells = []
        for name, (subset, got, lat, wall) in runs.items():
            idx = [i for i, p in enumerate(subset) if kind == "all" or p["kind"] == kind]
            sub = [subset[i] for i in idx]
            g = [got[i] for i in idx]
            row = _row(name, sub, g, [lat[i] for i in idx], wall if kind == "all" else 0, base_rate)
            rows.append({"pairs_kind": kind, **row})
            cells.append(f"{row['accuracy']:.1%} ({len(sub)})" if sub else "—")
        table.add_row(kind, *cells)
    console.print(table)
    summary = Table(title="Hand-written categories, all pairs")
    for col in (
        "method",
        "n",
        "accuracy",
        "precision",
        "recall",
        "false pos.",
        "pairs/s",
        "× math-verify",
        "p99 ms",
    ):
        summary.add_column(col, justify="left" if col == "method" else "right")
    for r in rows:
        if r["pairs_kind"] == "all":
            summary.add_row(
                r["method"],
                str(r["pairs"]),
                f"{r['accuracy']:.1%}",
                f"{r['precision']:.3f}",
                f"{r['recall']:.3f}",
                str(r["fp"]),
                f"{r['pairs_per_s']:.0f}",
                "—" if r["ratio"] is None else f"{r['ratio']:.1f}",
                f"{r['p99_ms']:.1f}",
            )
    console.print(summary)
    return rows


def mutation_table(console: Console) -> list[dict]:
    """Accepted mutants per kind: rstar2 strict and lenient beside math-verify, one run."""
    found = mutants()
    methods = {
        "math-verify": lambda m: math_verify_baseline(
            {"reference": m.gold, "response": f"\\boxed{{{m.text}}}"}
        ),
        "rstar2 strict": lambda m: ours_full(
            {"reference": m.gold, "response": f"<answer>\\boxed{{{m.text}}}</answer>"}
        ),
        "rstar2 lenient": lambda m: _lenient({"reference": m.gold, "prediction": m.text}),
    }
    accepted: dict[str, list[bool]] = {}
    rates: dict[str, float] = {}
    for name, fn in methods.items():
        start = time.perf_counter()
        accepted[name] = [bool(fn(m)) for m in found]
        rates[name] = len(found) / (time.perf_counter() - start)
    kinds = sorted({m.kind for m in found})
    table = Table(
        title=f"Mutants of the shipped gold answers accepted ({len(found)} mutants, {len({m.gold for m in found})} golds)"
    )
    table.add_column("kind", justify="left")
    table.add_column("mutants", justify="right")
    for name in methods:
        table.add_column(f"{name} accepts", justify="right")
    rows = []
    for kind in [*kinds, "all"]:
        idx = [i for i, m in enumerate(found) if kind == "all" or m.kind == kind]
        counts = {name: sum(accepted[name][i] for i in idx) for name in methods}
        rows.append({"kind": kind, "mutants": len(idx), **counts})
        table.add_row(kind, str(len(idx)), *(str(counts[name]) for name in methods))
    table.add_row("mutants/s", "", *(f"{rates[name]:.0f}" for name in methods))
    console.print(table)
    examples = [m for m, hit in zip(found, accepted["math-verify"], strict=True) if hit][:5]
    for m in examples:
        console.print(f"  math-verify accepts {m.text!r} for {m.gold!r} ({m.kind})")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dapo", type=int, default=2000, help="DAPO integer references to add (0: none)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, help="write the results as JSON")
    ap.add_argument("--categories-only", action="store_true", help="only the hand-written categories")
    ap.add_argument("--mutations-only", action="store_true", help="only the mutation table")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    console = Console(width=max(170, Console().width))
    check_answer("\\frac{1}{2}", "\\sqrt{\\frac14}")  # imports, grammar, caches: not timed
    math_verify_baseline({"reference": "1", "response": "\\boxed{1}"})
    if args.mutations_only:
        mutation_rows = mutation_table(console)
        if args.out:
            args.out.write_text(json.dumps({"argv": sys.argv, "mutations": mutation_rows}, indent=2))
        return 0
    categories = category_table(console)
    if args.categories_only:
        if args.out:
            args.out.write_text(json.dumps({"argv": sys.argv, "categories": categories}, indent=2))
        return 0
    mutation_rows = mutation_table(console)
    pairs = build_pairs(args.quick, 300 if args.quick else args.dapo)
    console.print(f"{len(pairs)} labelled pairs ({sum(p['label'] for p in pairs)} correct); warming up ...")
    check_answer("\\frac{1}{2}", "\\sqrt{\\frac14}")  # imports, grammar, caches: not timed
    math_verify_baseline({"reference": "1", "response": "\\boxed{1}"})

    results = []
    for kind in ("integer", "latex", "tricky", "all"):
        subset = [p for p in pairs if kind == "all" or p["kind"] == kind]
        got, lat, wall = _timed(math_verify_baseline, subset)
        base = _row("math-verify verify(parse, parse)", subset, got, lat, wall)
        rate = base["pairs_per_s"]
        got, lat, wall = _timed(ours_full, subset)
        full = _row("rstar2 full path (1 process)", subset, got, lat, wall, rate)
        decided = [p for p in subset if triage(p["reference"], p["response"])[0] is not None]
        got, lat, wall = _timed(ours_fast, decided)
        fast = _row("rstar2 fast path (pairs it decides)", decided, got, lat, wall, rate)
        with VerifierPool(args.workers, timeout_s=2.0) as pool:
            pool.check("\\frac{1}{2}", "\\sqrt{\\frac14}", extracted=True)  # start the template
            start = time.perf_counter()
            futures = [pool.submit(p["reference"], p["response"]) for p in subset]
            verdicts = [f.result() for f in futures]
            wall = time.perf_counter() - start
            lat = []  # verdicts' times include queueing behind thousands of submitted pairs
            pooled = _row(
                f"rstar2 VerifierPool ({args.workers} processes)",
                subset,
                [v.correct for v in verdicts],
                lat,
                wall,
                rate,
                pool.stats.timeouts,
            )
        for r in (base, fast, full, pooled):
            results.append({"pairs_kind": kind, **r})

    table = Table(title=f"rstar2 verifier benchmark ({os.cpu_count()} cores; ratio = pairs/s vs math-verify)")
    for col in [
        "pairs",
        "method",
        "n",
        "pairs/s",
        "× math-verify",
        "p50 ms",
        "p99 ms",
        "accuracy",
        "precision",
        "recall",
        "false pos.",
        "timeouts",
    ]:
        table.add_column(col, justify="left" if col in ("pairs", "method") else "right")
    for r in results:
        table.add_row(
            r["pairs_kind"],
            r["method"],
            str(r["pairs"]),
            f"{r['pairs_per_s']:.0f}",
            "—" if r["ratio"] is None else f"{r['ratio']:.1f}",
            "—" if r["p50_ms"] is None else f"{r['p50_ms']:.2f}",
            "—" if r["p99_ms"] is None else f"{r['p99_ms']:.1f}",
            f"{r['accuracy']:.2%}",
            f"{r['precision']:.4f}",
            f"{r['recall']:.4f}",
            str(r["fp"]),
            str(r["timeouts"]),
        )
    console.print(table)
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "argv": sys.argv,
                    "cores": os.cpu_count(),
                    "results": results,
                    "categories": categories,
                    "mutations": mutation_rows,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
