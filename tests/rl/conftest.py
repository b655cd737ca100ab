"""The tiny model taught to call the tool (the tiny models themselves are ``tests/conftest.py``'s)."""

import json

import pytest
import torch

from rstar2.rl.run.checkpoint import latest_checkpoint


@pytest.fixture(scope="session")
def tool_caller(tiny_dir, tmp_path_factory):
    """The tiny model after a short SFT on one tool-call conversation: it calls the tool."""
    from rstar2.config_files import parse_config
    from rstar2.rl.sft import SFTTrainer

    from .test_sft import conversation
    from .test_trainer import FP32

    root = tmp_path_factory.mktemp("caller")
    rows = [{"messages": conversation(a, b)} for a in range(2, 6) for b in range(3, 7)]
    (root / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = parse_config(
        {
            "kind": "sft",
            "chat": {"system_prompt": "Answer.", "tools_in_prompt": False},
            "model": {"path": str(tiny_dir), "threads": 1, **FP32},
            "data": {"train": str(root / "sft.jsonl")},
            "optim": {"lr": 1e-2, "warmup_steps": 2},
            "run": {"out": str(root / "run"), "steps": 60, "batch_size": 8, "progress": False},
        }
    )
    threads = torch.get_num_threads()
    try:
        SFTTrainer(cfg).train()
    finally:
        torch.set_num_threads(threads)
    return latest_checkpoint(root / "run")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A folder with ``train.jsonl``: twelve addition problems (the asynchronous and replay runs')."""
    root = tmp_path_factory.mktemp("additions")
    rows = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(12)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root
