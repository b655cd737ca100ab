"""Configs fail loudly and clearly; checkpoints are complete or absent; lr schedule; data order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rstar2.config import RLConfig
from rstar2.config_files import ConfigError, load_config, parse_config
from rstar2.rl.optim import build_optimizer, lr_factor
from rstar2.rl.run.checkpoint import latest_checkpoint, load_trainer_state, save_checkpoint
from rstar2.rl.run.data import DataStream
from rstar2.rl.run.metrics_log import MetricsLog, read_metrics

ROOT = Path(__file__).resolve().parents[2]
BASE = {"model": {"path": "m"}, "data": {"train": "d.jsonl"}}


def test_defaults_are_the_papers():
    cfg = parse_config(BASE)
    assert isinstance(cfg, RLConfig)
    assert (cfg.loss.clip_low, cfg.loss.clip_high, cfg.loss.kl_coef, cfg.loss.entropy_coef) == (
        0.2,
        0.28,
        0.0,
        0.0,
    )
    assert (cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.grad_clip) == (1e-6, 20, 1.0)
    assert cfg.roc.mode == "lowest" and cfg.loss.aggregation == "token-mean"


def test_overrides_and_clear_errors(tmp_path):
    cfg = parse_config(BASE, ["optim.lr=3e-5", "roc.mode=weighted", "rollout.samples=4", "roc.keep=2"])
    assert cfg.optim.lr == 3e-5 and cfg.roc.mode == "weighted" and cfg.roc.keep == 2
    with pytest.raises(ConfigError, match=r"optim\.lrr"):
        parse_config(BASE, ["optim.lrr=1"])  # a typo is an error, not a silent default
    with pytest.raises(ConfigError, match="cannot exceed rollout.samples"):
        parse_config(BASE, ["roc.keep=32"])
    with pytest.raises(ConfigError, match="kind"):
        parse_config({**BASE, "kind": "dpo"})
    with pytest.raises(ConfigError, match="key=value"):
        parse_config(BASE, ["optim.lr"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")


def test_train_command_reports_a_broken_config(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: rl\nmodel: {path: m}\ndata: {train: d}\nroc: {mode: best}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "rstar2", "train", str(bad)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "roc.mode" in proc.stderr and "Traceback" not in proc.stderr


def test_lr_schedule_by_hand():
    assert [lr_factor(s, 4, 10) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert lr_factor(4, 4, 10, "cosine", 0.1) == pytest.approx(1.0)
    assert lr_factor(10, 4, 10, "cosine", 0.1) == pytest.approx(0.1)
    assert lr_factor(7, 4, 10, "cosine", 0.0) == pytest.approx(0.5)


def test_problem_stream_continues_from_a_position():
    rows = list(range(10))
    a = DataStream(rows, seed=3, shuffle=True)
    first = a.take(7) + a.take(8)  # crosses into the second epoch
    assert sorted(first[:10]) == rows  # every row once per epoch
    b = DataStream(rows, seed=3, shuffle=True, position=7)
    assert b.take(8) == first[7:]


def test_checkpoint_round_trip_and_incomplete_ones_are_ignored(tiny, tmp_path):
    import copy

    from rstar2.config import OptimSection

    model = copy.deepcopy(tiny[0])
    opt, sched = build_optimizer(model, OptimSection(lr=1e-2, warmup_steps=3), 10)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    sched.step()
    path = save_checkpoint(tmp_path, 1, model, opt, sched, tiny[1], {"data_position": 5})
    expected = torch.rand(3)  # what the saved RNG state draws next
    (tmp_path / "checkpoints" / "step-000002.tmp").mkdir()  # a save cut short by a kill
    (tmp_path / "checkpoints" / "step-000003").mkdir()  # no state.json: incomplete
    assert latest_checkpoint(tmp_path) == path

    from transformers import AutoModelForCausalLM

    again = AutoModelForCausalLM.from_pretrained(path)
    for (k, v), (_, w) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(v, w), k
    opt2, sched2 = build_optimizer(again, OptimSection(lr=1e-2, warmup_steps=3), 10)
    torch.manual_seed(123)  # moved elsewhere; loading must restore it
    state = load_trainer_state(path, again, opt2, sched2)
    assert torch.equal(torch.rand(3), expected)
    assert state["step"] == 1 and state["data_position"] == 5
    assert sched2.get_last_lr() == sched.get_last_lr()
    m1, m2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert all(torch.equal(m1[i]["exp_avg"], m2[i]["exp_avg"]) for i in m1)


def test_metrics_log_drops_steps_after_the_resumed_checkpoint(tmp_path):
    log = MetricsLog(tmp_path, tensorboard=False)
    for s in range(1, 5):
        log.log(s, {"loss": float(s)})
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "lo')  # a line cut by a kill
    log.close()
    assert (tmp_path / "metrics.png").is_file()
    MetricsLog(tmp_path, tensorboard=False, resume_step=2).log(3, {"loss": 30.0})
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path / "metrics.jsonl")] == [
        (1, 1.0),
        (2, 2.0),
        (3, 30.0),
    ]


def test_a_new_stage_carries_the_optimizer_moments_but_keeps_its_own_settings(tiny, tmp_path):
    """run.init_from = the last stage's checkpoint carries its AdamW moments (not its lr) unless
    optim.reset_optimizer; a plain model folder has none to carry."""
    import copy

    from rstar2.config import OptimSection
    from rstar2.rl.run.checkpoint import carry_optimizer_state

    model = copy.deepcopy(tiny[0])
    opt, sched = build_optimizer(model, OptimSection(lr=1e-2, warmup_steps=0), 10)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    path = save_checkpoint(tmp_path, 1, model, opt, sched, tiny[1], {"data_position": 0})

    nxt = copy.deepcopy(model)
    opt2, _ = build_optimizer(nxt, OptimSection(lr=3e-5, warmup_steps=5, betas=(0.9, 0.99)), 10)
    assert carry_optimizer_state(path, nxt, opt2)
    m1, m2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert m2 and all(torch.equal(m1[i]["exp_avg_sq"], m2[i]["exp_avg_sq"]) for i in m1)
    assert all(g["initial_lr"] == 3e-5 and g["betas"] == (0.9, 0.99) for g in opt2.param_groups)
    opt3, _ = build_optimizer(nxt, OptimSection(), 10)
    plain = tmp_path / "plain"
    plain.mkdir()
    assert not carry_optimizer_state(plain, nxt, opt3) and not opt3.state_dict()["state"]
