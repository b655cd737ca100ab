"""A recipe run stopped once its SFT stage's checkpoint is recorded: the start `rstar2 compare`
needs, without the RL stages and evaluations after it.

    python benchmarks/sft_checkpoint.py RUN [--set KEY=VALUE ...]   # e.g. --set model.device=cuda

Runs `rstar2 demo --recipe smollm2-135m --out RUN` with the zero-shot and after-SFT evaluations left
out (the arms of a comparison evaluate the SFT checkpoint themselves) and stops it when
`recipe_state.json` records the `sft` stage.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--recipe", default="smollm2-135m")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    args = ap.parse_args()
    cmd = [
        sys.executable,
        "-m",
        "rstar2",
        "demo",
        "--recipe",
        args.recipe,
        "--out",
        str(args.run),
        "--no-progress",
    ]
    for s in ["eval.plain_before=false", "eval.heldout_at=[]", *args.sets]:
        cmd += ["--set", s]
    proc = subprocess.Popen(cmd)
    while proc.poll() is None:
        try:
            if "sft" in json.loads((args.run / "recipe_state.json").read_text()).get("stages", {}):
                print("SFT checkpoint recorded: the run stopped there", flush=True)
                proc.terminate()
                proc.wait()
                return 0
        except (OSError, ValueError):
            pass
        time.sleep(1)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
