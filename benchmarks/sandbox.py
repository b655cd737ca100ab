#!/usr/bin/env python3
"""Sandbox benchmark: local pool, HTTP service and Redis mode against a fresh `python3 -c` per call.

    python benchmarks/sandbox.py                   # the full table (1, 8, 64, 256 in flight)
    python benchmarks/sandbox.py --quick           # a short run
    python benchmarks/sandbox.py --stress 45000    # also: 45,000 trivial calls at 4,096 in flight

Prints a table; ratios are against the baseline measured in the same run.
"""

import argparse
from pathlib import Path

from rstar2.sandbox.bench import main

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--modes", default="baseline,pool,http,redis")
    ap.add_argument("--workloads", default="trivial,sympy,loop")
    ap.add_argument("--concurrency", default="1,8,64,256")
    ap.add_argument("--workers", type=int, default=None, help="sandbox workers (default: CPU count)")
    ap.add_argument("--stress", type=int, default=0, help="also run this many trivial calls through the pool")
    ap.add_argument("--stress-in-flight", type=int, default=4096)
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    a = ap.parse_args()
    main(
        quick=a.quick,
        modes=a.modes.split(","),
        workloads=a.workloads.split(","),
        concurrency=[int(c) for c in a.concurrency.split(",")],
        out=a.out,
        workers=a.workers,
        stress_calls=a.stress,
        stress_in_flight=a.stress_in_flight,
    )
