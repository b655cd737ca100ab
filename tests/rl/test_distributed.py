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


def test_one_process_on_cuda_names_its_device_by_number(monkeypatch):
    """``torch.cuda.set_device`` (the update's worker thread: ``on_device``) refuses a bare ``cuda``:
    a one-process world names the current device by number, as torchrun's ``cuda:N`` does."""
    from rstar2.rl.run.distributed import World, init_world, on_device

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert init_world("auto").device == init_world("cuda").device == torch.device("cuda", 3)
    assert init_world("cuda:1").device == torch.device("cuda", 1)
    assert init_world("cpu").device == torch.device("cpu")
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    for world in (init_world("cuda"), World()):
        assert on_device(world, lambda x: x + 1)(1) == 2
    assert chosen == [torch.device("cuda", 3)]
