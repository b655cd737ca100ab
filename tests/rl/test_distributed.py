"""Two training processes (torchrun, FSDP2 on gloo) end an update with the parameters of one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def _run(cmd: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(900)  # two torchrun processes, each importing torch on a loaded VM
def test_two_processes_end_the_step_with_the_parameters_of_one(tiny_dir, tmp_path):
    from .two_process_step import main

    script = str(HERE / "two_process_step.py")
    main(str(tiny_dir), str(tmp_path / "one.pt"))  # one process: in this one (saves a start-up)
    _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            script,
            str(tiny_dir),
            str(tmp_path / "two.pt"),
        ]
    )
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert one["weights"].keys() == two["weights"].keys()
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(tiny_dir).state_dict()
    moved = max(float((one["weights"][k] - start[k]).abs().max()) for k in one["weights"])
    assert moved > 1e-3  # the update did change the weights
    for k in one["weights"]:
        assert torch.allclose(one["weights"][k], two["weights"][k], atol=1e-6, rtol=1e-5), k
    assert one["stats"]["loss"] == pytest.approx(two["stats"]["loss"], rel=1e-4, abs=1e-7)
    assert one["stats"]["update/clip_high"] == pytest.approx(two["stats"]["update/clip_high"], abs=1e-6)


@pytest.mark.parametrize(("device", "expected"), [("cuda", 3), ("cuda:1", 1), ("cpu", None)])
def test_a_worker_thread_is_put_on_the_callers_gpu_by_index(monkeypatch, device, expected):
    """One process asks for ``cuda`` (no index), which ``torch.cuda.set_device`` refuses: the thread
    gets the caller's current device by number; torchrun's ``cuda:N`` keeps N; a CPU run sets none."""
    from rstar2.rl.distributed import World, on_device

    chosen = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    wrapped = on_device(World(device=torch.device(device)), lambda x: x + 1)
    assert wrapped(1) == 2
    assert chosen == ([] if expected is None else [expected])
