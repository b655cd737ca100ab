"""``run.wandb``: a run's metrics also go to Weights & Biases, offline (no network), read back from
the W&B run file itself."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

from rstar2.rl.run.metrics_log import MetricsLog, read_metrics

from .test_async import _config, _train


def wandb_records(path: Path) -> list:
    """The protobuf records of a ``.wandb`` file: a 7-byte header, then LevelDB-log records (CRC32,
    length, type; FULL = 1, FIRST = 2, MIDDLE = 3, LAST = 4) in 32 KiB blocks."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = path.read_bytes(), 32 * 1024
    assert data[:4] == b":W&B", data[:7]
    out, pos, parts = [], 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a record header: padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            break
        parts += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(parts)
            out.append(record)
            parts = b""
    return out


@pytest.mark.slow
def test_metrics_go_to_weights_and_biases_offline(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline unless said otherwise
    data = tmp_path
    (data / "train.jsonl").write_text(
        "".join(json.dumps({"problem": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(8))
    )
    cfg = _config(tiny_dir, data, "run", steps=2)
    cfg.run.wandb = "rstar2-test"
    _train(cfg)
    run = Path(cfg.run.out)
    files = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, list((run / "wandb").iterdir())
    records = wandb_records(files[0])
    kinds = [r.WhichOneof("record_type") for r in records]
    started = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert started.project == "rstar2-test" and started.run_id == (run / "wandb_id").read_text()
    config = {i.key: json.loads(i.value_json) for i in started.config.update}
    assert config["optim"]["lr"] == cfg.optim.lr and config["kind"] == "rl"
    history = [
        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    logged = read_metrics(run / "metrics.jsonl")
    assert [h["_step"] for h in history] == [m["step"] for m in logged] == [1, 2], kinds
    for h, m in zip(history, logged, strict=True):
        assert h["loss"] == m["loss"] and h["reward/mean"] == m["reward/mean"]


def test_without_the_extra_run_wandb_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'rstar2\[wandb\]'"):
        MetricsLog(tmp_path, tensorboard=False, wandb="p")
