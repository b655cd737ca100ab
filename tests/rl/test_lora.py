"""Low-rank adapters (``model.lora``, rstar2.adapters): a new adapter changes nothing until trained
and only it trains; its checkpoint holds the adapter alone and loads, merged or trained on, as the
model that saved it; SFT and RL train it, the in-process engine decodes with it after each update,
and a run resumed from an adapter checkpoint continues exactly."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rstar2.adapters import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    is_adapter,
    load_adapter_into,
    load_model,
    merge_folder,
    save_adapter,
)
from rstar2.config import LoraSection
from rstar2.config_files import parse_config
from rstar2.rl.run.checkpoint import latest_checkpoint
from rstar2.rl.run.metrics_log import read_metrics

from ..conftest import proxy
from .test_health_in_runs import train
from .test_scale_out import other_weights, serve_tiny  # noqa: F401 - other_weights: a fixture
from .test_trainer import place, rl_config

LORA = {"rank": 4, "alpha": 8}
IDS = torch.tensor([[5, 17, 42, 99, 7, 3]])


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


def moved(model: torch.nn.Module) -> torch.nn.Module:
    """The adapter's B (zero when attached) set to random values: an adapter that computes something."""
    torch.manual_seed(1)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.2)
    return model


def test_a_new_adapter_changes_nothing_and_only_it_trains(tiny_dir):
    base = load_model(tiny_dir)
    adapted = load_model(tiny_dir, lora=LoraSection(**LORA))
    assert torch.equal(logits(base), logits(adapted))
    trained = [n for n, p in adapted.named_parameters() if p.requires_grad]
    frozen = [n for n, p in adapted.named_parameters() if not p.requires_grad]
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    assert {n.replace(".base_layer", "") for n in frozen} == {n for n, _ in base.named_parameters()}
    # every linear layer of the blocks adapted (PEFT's all-linear: the output head left alone)
    linears = [n for n, m in base.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    assert len(trained) == 2 * len(linears)


def test_an_adapter_checkpoint_loads_merged_trained_on_or_by_hugging_face(tiny_dir, tmp_path):
    model = moved(load_model(tiny_dir, lora=LoraSection(**LORA)))
    want = logits(model)
    assert not torch.allclose(want, logits(load_model(tiny_dir)), atol=1e-3)  # the adapter computes
    folder = save_adapter(model, tmp_path / "ckpt")
    assert is_adapter(folder) and sorted(p.name for p in folder.iterdir()) == [
        ADAPTER_CONFIG,
        ADAPTER_WEIGHTS,
    ]
    assert json.loads((folder / ADAPTER_CONFIG).read_text())["base_model_name_or_path"] == str(
        tiny_dir.resolve()
    )
    shapes = [t.shape for t in load_file(str(folder / ADAPTER_WEIGHTS)).values()]
    assert all(4 in s for s in shapes)  # rank 4: nothing of the base model in the folder
    merged = load_model(folder)  # for engines and evaluations: a plain model
    assert not any("lora" in n for n, _ in merged.named_parameters())
    assert torch.allclose(logits(merged), want, atol=1e-5)
    again = load_model(folder, lora=LoraSection(**LORA))  # the next stage, or a resumed run, trains on
    assert torch.equal(logits(again), want)
    assert any(p.requires_grad for n, p in again.named_parameters() if "lora_B" in n)
    with pytest.raises(ValueError, match="rank 4.*rank 8"):
        load_model(folder, lora=LoraSection(rank=8, alpha=8))
    from transformers import AutoModelForCausalLM

    assert torch.allclose(logits(AutoModelForCausalLM.from_pretrained(folder)), want, atol=1e-5)
    shutil.copy(tiny_dir / "tokenizer.json", folder)  # a checkpoint keeps its tokenizer
    shutil.copy(tiny_dir / "tokenizer_config.json", folder)
    out = merge_folder(folder, tmp_path / "merged")
    assert (out / "model.safetensors").is_file() and not is_adapter(out)
    assert torch.allclose(logits(AutoModelForCausalLM.from_pretrained(out)), want, atol=1e-5)


def test_an_adapter_whose_base_is_gone_is_refused_by_name(tiny_dir, tmp_path):
    folder = save_adapter(load_model(tiny_dir, lora=LoraSection(**LORA)), tmp_path / "ckpt")
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    config["base_model_name_or_path"] = str(tmp_path / "gone")
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config))
    with pytest.raises(FileNotFoundError, match="names its base model .*gone"):
        load_model(folder)


def lora_rl(tiny_dir, data, out, **settings) -> dict:
    tree = rl_config(tiny_dir, data / "train.jsonl", out)
    tree["model"]["lora"] = LORA
    tree["optim"]["lr"] = 5e-2  # an adapter's learning rate: ~10x full fine-tuning's
    tree["run"].update(steps=4)
    return place(tree, **settings)


@pytest.mark.slow
def test_rl_trains_the_adapter_alone_and_resumes_from_its_checkpoint_exactly(tiny_dir, data):
    run = data / "a"
    history = train(lora_rl(tiny_dir, data, run))
    assert len(history) == 4
    rows = [r for r in read_metrics(run / "metrics.jsonl") if "update/skipped" not in r]
    # the engine decodes the adapted model: after every update its log-probs are the trainer's
    assert rows and all(r["update/engine_gap"] < 1e-4 for r in rows), [r["update/engine_gap"] for r in rows]
    assert rows[-1]["update/ref_kl"] > 0  # the policy moved from its start
    ckpt = latest_checkpoint(run)
    assert is_adapter(ckpt) and not (ckpt / "model.safetensors").exists()
    assert (ckpt / "trainer_state.pt").is_file()
    adapter = load_file(str(ckpt / ADAPTER_WEIGHTS))
    assert any(t.abs().max() > 0 for k, t in adapter.items() if "lora_B" in k)  # B left zero
    # the base model's folder untouched; the checkpoint loads as any model (merged)
    merged = load_model(ckpt)
    assert not torch.allclose(logits(merged), logits(load_model(tiny_dir)), atol=1e-4)
    # a run resumed from step 2's checkpoint ends with the same adapter as the one that went on
    resumed = data / "b"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(run / "checkpoints" / "step-000002", resumed / "checkpoints" / "step-000002")
    train(lora_rl(tiny_dir, data, resumed), resume=True)
    again = load_file(str(latest_checkpoint(resumed) / ADAPTER_WEIGHTS))
    assert adapter.keys() == again.keys()
    for k in adapter:
        assert torch.allclose(adapter[k], again[k], atol=1e-6), k


@pytest.mark.slow
def test_an_adapter_reaches_an_engine_copy_at_staleness_one(tiny_dir, data):
    """At k = 1 the engine decodes a copy that gets each update's weights, checked exactly."""
    run = data / "k1"
    tree = lora_rl(tiny_dir, data, run, max_staleness=1)
    tree["rollout"]["top_k"] = 0
    tree["loss"] = {"tis_cap": 2.0}
    history = train(tree)
    assert len(history) == 4 and is_adapter(latest_checkpoint(run))


@pytest.mark.slow
def test_sft_trains_an_adapter_that_the_next_stage_trains_on(tiny_dir, tmp_path):
    """An SFT stage with an adapter learns (its loss falls), saves the adapter alone; an RL stage
    started from that checkpoint (``run.init_from``) trains the same adapter on, with its moments:
    its learner computes what SFT's checkpoint does."""
    from rstar2.rl.run.launch import begin, load_learner

    from .test_sft import sft_run

    history = sft_run(tiny_dir, tmp_path, epochs=8, lr=5e-2, lora=LORA, compute="fp32")
    # a rank-4 adapter on a random 64-wide model with its embeddings frozen learns little of random
    # text (6.3 to ~5.9 nats, where training every weight reaches 1.6), but it learns
    losses = [h["loss"] for h in history]
    assert sum(losses[-4:]) / 4 < losses[0] - 0.2, losses
    sft_ckpt = latest_checkpoint(tmp_path / "run")
    assert is_adapter(sft_ckpt) and not (sft_ckpt / "model.safetensors").exists()

    rl = lora_rl(tiny_dir, tmp_path, tmp_path / "rl")
    rl["run"]["init_from"] = str(sft_ckpt)
    cfg = parse_config(rl)
    learner, state, _ = load_learner(cfg, begin(cfg, resume=False), updates=4)
    assert state == {}
    assert torch.allclose(logits(learner.model), logits(load_model(sft_ckpt)), atol=1e-5)
    assert all(".lora_" in n for n, p in learner.model.named_parameters() if p.requires_grad)
    assert learner.optimizer.state  # SFT's AdamW moments carried to the new stage


def test_model_merge_writes_a_whole_model_from_a_run_or_refuses_a_whole_model(tiny_dir, tmp_path):
    """``rstar2 model merge RUN --out DIR``: the run's last checkpoint merged; a folder without an
    adapter refused with exit status 2."""
    import subprocess
    import sys

    ckpt = tmp_path / "run" / "checkpoints" / "step-000003"
    save_adapter(moved(load_model(tiny_dir, lora=LoraSection(**LORA))), ckpt)
    (ckpt / "state.json").write_text("{}")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_dir / name, ckpt)
    cli = [sys.executable, "-m", "rstar2", "model", "merge"]
    done = subprocess.run(
        [*cli, str(tmp_path / "run"), "--out", str(tmp_path / "m")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    from transformers import AutoModelForCausalLM

    want = logits(load_model(ckpt))
    assert torch.allclose(logits(AutoModelForCausalLM.from_pretrained(tmp_path / "m")), want, atol=1e-5)
    refused = subprocess.run(
        [*cli, str(tiny_dir), "--out", str(tmp_path / "n")], capture_output=True, text=True
    )
    assert refused.returncode == 2 and "holds no adapter" in " ".join(refused.stderr.split())


def test_a_merge_into_a_bf16_base_keeps_a_small_update(tiny_dir, tmp_path):
    """A rank-8 adapter whose update is mostly below bf16's spacing: merged (and written) in fp32 it
    computes what the unmerged adapter computes in fp32; added into bf16 weights it would lose a
    good part of its effect. ``--out`` a file, a source that is not there: refused, nothing written."""
    import subprocess
    import sys

    from transformers import AutoModelForCausalLM

    base = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(tiny_dir).to(torch.bfloat16).save_pretrained(base)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_dir / name, base)
    adapted = load_model(base, dtype=torch.float32, lora=LoraSection(rank=8, alpha=16))
    torch.manual_seed(0)
    with torch.no_grad():
        for n, p in adapted.named_parameters():
            if "lora_B" in n:
                p.copy_(2e-4 * torch.randn_like(p))
    ckpt = save_adapter(adapted, tmp_path / "ckpt")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_dir / name, ckpt)
    want, start = logits(adapted), logits(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32))

    def kept(got: torch.Tensor) -> float:  # the share of the adapter's effect on the logits kept
        return 1 - float((got - want).norm() / (want - start).norm())

    merged = AutoModelForCausalLM.from_pretrained(merge_folder(ckpt, tmp_path / "merged"))
    assert kept(logits(merged)) > 0.999
    in_bf16 = load_model(ckpt, dtype=torch.bfloat16).float()  # what a merge in the base's precision keeps
    assert kept(logits(in_bf16)) < 0.9
    # an engine that computes in bf16 (a GPU's) serves the adapter merged into bf16 weights: that
    # costs about what computing in bf16 costs anyway, against the adapter kept unmerged
    unmerged = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    load_adapter_into(unmerged, ckpt)
    served = load_model(ckpt, dtype=torch.bfloat16)

    def off(model: torch.nn.Module) -> float:
        return float((logits(model).float() - want).norm())

    assert off(served) <= 1.25 * off(unmerged), (off(served), off(unmerged))
    cli = [sys.executable, "-m", "rstar2", "model", "merge", str(ckpt), "--out"]
    (tmp_path / "a-file").write_text("x")
    for out, words in ((tmp_path / "a-file", "a file"), (tmp_path / "merged", "not empty")):
        done = subprocess.run([*cli, str(out)], capture_output=True, text=True)
        assert done.returncode == 2 and words in " ".join(done.stderr.replace("│", " ").split()), done.stderr
    gone = subprocess.run(
        [*cli[:-2], str(tmp_path / "gone"), "--out", str(tmp_path / "m")], capture_output=True, text=True
    )
    assert (
        gone.returncode == 2
        and "does not exist" in " ".join(gone.stderr.replace("│", " ").split())
        and not (tmp_path / "m").exists()
    )
    (ckpt / "tokenizer.json").unlink()  # a merge that fails half way leaves nothing
    (ckpt / "tokenizer_config.json").unlink()
    failed = subprocess.run([*cli, str(tmp_path / "m")], capture_output=True, text=True)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr
    assert not (tmp_path / "m").exists() and not list(tmp_path.glob(".m.partial*"))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_recipe_trains_adapters_in_its_rl_stages_through_the_cli(tmp_path):
    """``defaults.rl.model.lora``: SFT trains every weight, the first RL stage a new adapter on SFT's
    checkpoint, the next trains that adapter on; evaluations decode the adapted policy; every RL step
    redone from what it kept is the run's (``rstar2 replay``); ``rstar2 model merge`` exports it."""
    import subprocess
    import sys

    import yaml

    from tests.recipe.test_recipe import miniature

    tree = miniature()
    tree["stages"] = tree["stages"][:3]  # sft, rl-64, rl-128
    tree["eval"].update(heldout_at=["rl-128"], also=[])
    tree["defaults"]["rl"]["model"] = {"lora": {"rank": 2, "alpha": 16}}
    tree["defaults"]["rl"]["optim"] = {"lr": 2e-2}
    tree["defaults"]["rl"]["run"]["kl_to_start"] = True  # the reference: the adapter switched off
    recipe = tmp_path / "lora.yaml"
    recipe.write_text(yaml.safe_dump(tree))
    out = tmp_path / "run"
    cli = [sys.executable, "-m", "rstar2"]
    done = subprocess.run(
        [*cli, "train", "--recipe", str(recipe), "--out", str(out)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((out / "recipe_state.json").read_text())
    sft, rl64, rl128 = (state["stages"][s]["checkpoint"] for s in ("sft", "rl-64", "rl-128"))
    assert not is_adapter(sft) and is_adapter(rl64) and is_adapter(rl128)
    for ckpt in (rl64, rl128):  # both adapters sit on SFT's whole model
        assert json.loads((Path(ckpt) / ADAPTER_CONFIG).read_text())["base_model_name_or_path"] == str(
            Path(sft).resolve()
        )
    assert "rl-128" in state["evals"] and "| rl-128 |" in (out / "report.md").read_text()
    for stage, steps in (("02-rl-64", 1), ("03-rl-128", 2)):
        again = subprocess.run(
            [*cli, "replay", str(out / stage), "--from", "1", "--to", str(steps)],
            capture_output=True,
            text=True,
        )
        assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    merged = subprocess.run(
        [*cli, "model", "merge", str(out / "03-rl-128"), "--out", str(tmp_path / "m")],
        capture_output=True,
        text=True,
    )
    assert merged.returncode == 0, merged.stderr
    from transformers import AutoModelForCausalLM

    assert torch.allclose(
        logits(AutoModelForCausalLM.from_pretrained(tmp_path / "m")), logits(load_model(rl128)), atol=1e-5
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_adapter_under_torchrun_ends_as_one_process_would(tiny_dir, data, tmp_path):
    """FSDP2 shards the frozen base and the adapter alike; two processes train the adapter one would."""
    from .test_scale_out import cli, ok, torchrun, write_config

    adapters = {}
    for n in (1, 2):
        out = tmp_path / f"n{n}"
        tree = lora_rl(tiny_dir, data, out)
        tree["run"].update(steps=2, save_every=1)
        tree["optim"]["lr"] = 1e-2
        path = write_config(tree, tmp_path / f"n{n}.yaml")
        ok(cli(["train", str(path)]) if n == 1 else torchrun(2, ["train", str(path)]))
        assert is_adapter(latest_checkpoint(out))
        adapters[n] = load_file(str(latest_checkpoint(out) / ADAPTER_WEIGHTS))
    moved = max(float(t.abs().max()) for k, t in adapters[1].items() if "lora_B" in k)
    assert moved > 1e-4 and adapters[1].keys() == adapters[2].keys()
    worst = max(float((adapters[1][k] - adapters[2][k]).abs().max()) for k in adapters[1])
    assert worst <= moved / 100, (worst, moved)


# -- an adapter on served engines -----------------------------------------------------------------
@pytest.fixture
def server(other_weights, tmp_path_factory):  # noqa: F811 - the fixture imported above
    """``rstar2 serve`` on other weights than the trainer's start: the run's first publish must
    bring the base model, each later one the adapter alone."""
    yield from serve_tiny(other_weights, tmp_path_factory.getbasetemp())


def served_rl(tiny_dir, data, out, servers, **settings) -> dict:
    tree = lora_rl(tiny_dir, data, out, servers=servers, **settings)
    tree["run"].update(steps=2, save_every=1, keep_steps=True)
    return tree


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_served_engine_takes_the_base_once_then_only_the_adapter(server, tiny_dir, data, tmp_path):
    import httpx

    from rstar2.engines.base import weights_fingerprint

    from .test_scale_out import cli, ok, write_config

    out = tmp_path / "run"
    ok(cli(["train", str(write_config(served_rl(tiny_dir, data, out, [server]), tmp_path / "rl.yaml"))]))
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    # after each update the server sampled with the trainer's adapted model
    assert all(r["sync/logprob_diff"] < 1e-4 for r in rows), [r["sync/logprob_diff"] for r in rows]
    info = httpx.get(server + "/get_server_info").json()
    # the base, then the adapter at the run's start and after each of the two steps
    assert info["weights_version"] == 2 and info["weights_loads"] == 4
    assert info["weights_path"] == str((out / "weights-latest").resolve())
    final = load_file(str(latest_checkpoint(out) / ADAPTER_WEIGHTS))
    assert info["weights_fingerprint"] == pytest.approx(weights_fingerprint(final), rel=1e-12)
    sent = out / "weights-latest"
    assert is_adapter(sent) and not (sent / "model.safetensors").exists()
    adapter_bytes = (sent / ADAPTER_WEIGHTS).stat().st_size
    assert adapter_bytes < (sent / "base" / "model.safetensors").stat().st_size / 5
    ok(cli(["replay", str(out), "--from", "1", "--to", "2"]))  # the server's tokens, trained again


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_served_adapter_at_staleness_one_trains_only_reported_versions(server, tiny_dir, data, tmp_path):
    from .test_async import assert_versions_in_bound
    from .test_scale_out import cli, ok, write_config

    out = tmp_path / "run"
    tree = served_rl(tiny_dir, data, out, [server], max_staleness=1)
    tree["rollout"]["top_k"] = 0
    tree["loss"] = {"tis_cap": 2.0}
    tree["run"]["steps"] = 3
    ok(cli(["train", str(write_config(tree, tmp_path / "rl.yaml"))]))
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3]
    assert_versions_in_bound(out, k=1)


def skipping_proxy(upstream: str, skip_from: int, route: str = "update_weights_from_disk"):
    """A server in front of ``upstream`` that passes everything on, except the adapter loads (on
    ``route``) from the ``skip_from``-th on: those it answers "success" with the version asked,
    loading nothing (verl #7495: the adapter never reached the server, and nothing said so)."""
    loads = []

    def skip(path: str, asked: dict):
        if path == route and is_adapter(asked.get("model_path") or asked.get("lora_path")):
            loads.append(asked)
            if len(loads) >= skip_from:
                return {"success": True, "weights_version": int(asked.get("weight_version", 0))}, 200
        return None

    return proxy(upstream, intercept=skip)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_adapter_load_a_server_skipped_is_refused_by_the_version_check(server, tiny_dir, data, tmp_path):
    """The server took the base and the first adapter, then said "success" to the next load without
    loading it: its tokens still say the version that sampled them, and no step trains on them."""
    from .test_scale_out import cli, write_config

    out = tmp_path / "run"
    with skipping_proxy(server, skip_from=2) as url:
        tree = served_rl(tiny_dir, data, out, [url])
        tree["rollout"]["engine"]["weight_check_tol"] = None  # no probe: the versions alone catch it
        run = cli(["train", str(write_config(tree, tmp_path / "rl.yaml"))])
    said = " ".join(run.stderr.split())
    assert run.returncode == 1, said[-3000:]
    assert "RL step 2 failed: StalenessError" in said, said[-3000:]
    assert f"engine {url} sampled a token with policy version 0, outside [1, 1]" in said, said[-3000:]
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1]  # step 1 trained, not step 2


def test_a_recipe_sets_an_adapter_for_all_stages_one_kind_or_one_stage():
    """``model.lora`` (every stage), ``defaults.rl.model.lora`` (the RL stages), a stage's own
    ``model: {lora: ...}`` (``null``: every weight there); a stage may set nothing else of model:."""
    import yaml

    from rstar2.config_files import ConfigError
    from rstar2.recipe.spec import find_recipe, parse_recipe, stage_tree

    def adapters(tree: dict) -> dict:
        recipe = parse_recipe(tree)
        stages = {s.name: stage_tree(recipe, s, model_path="m", train="t", out="o") for s in recipe.stages}
        loras = {name: parse_config(t).model.lora for name, t in stages.items()}
        return {name: lora.rank if lora else 0 for name, lora in loras.items()}

    tree = yaml.safe_load(find_recipe("tiny").read_text())
    names = [s["name"] for s in tree["stages"]]
    assert set(adapters(tree).values()) == {0}
    tree["defaults"]["rl"]["model"] = {"lora": {"rank": 8}}
    assert adapters(tree) == {n: 0 if n == "sft" else 8 for n in names}
    tree["stages"][-1]["model"] = {"lora": None}
    assert adapters(tree) == {n: 0 if n in ("sft", names[-1]) else 8 for n in names}
    tree["model"]["lora"] = {"rank": 2}
    del tree["defaults"]["rl"]["model"]
    assert adapters(tree) == {n: 0 if n == names[-1] else 2 for n in names}
    tree["stages"][-1]["model"] = {"dtype": "bfloat16"}
    with pytest.raises(ConfigError, match=f"stages.{names[-1]}.model: a stage sets only lora"):
        parse_recipe(tree)


def test_the_reference_of_a_new_adapter_is_its_base_without_a_copy(tiny_dir, tmp_path):
    """With an adapter new at the stage's start, the KL's reference is the policy with its adapter
    switched off for the pass (``adapters.BaseOf``): the start's logits, the adapter on again after."""
    from rstar2.adapters import BaseOf, base_reference

    policy = moved(load_model(tiny_dir, lora=LoraSection(**LORA)))
    adapted_logits = logits(policy)
    ref = base_reference(policy, tiny_dir)
    assert isinstance(ref, BaseOf) and not list(ref.parameters())  # no weights of its own
    with torch.no_grad():
        assert torch.equal(ref(input_ids=IDS).logits, logits(load_model(tiny_dir)))
    assert torch.equal(logits(policy), adapted_logits)
    assert all(p.requires_grad for n, p in policy.named_parameters() if ".lora_" in n)
    # an adapter carried over from an adapter checkpoint: its start is not its base, so a copy
    assert base_reference(policy, save_adapter(policy, tmp_path / "ckpt")) is None


def test_an_engine_takes_an_adapter_over_its_base_and_refuses_one_that_does_not_fit(tiny_dir, tmp_path):
    """``HFEngine.update_adapter`` (what ``rstar2 serve`` runs for an adapter folder): the adapter
    injected on the first load, replaced after; another rank or missing tensors refused before
    anything is written, the engine serving what it held."""
    from rstar2.engines.hf import HFEngine

    engine = HFEngine(load_model(tiny_dir), max_batch_size=2)
    try:
        policy = moved(load_model(tiny_dir, lora=LoraSection(**LORA)))
        assert engine.update_adapter(save_adapter(policy, tmp_path / "v1"), 1) == 2 * 14
        assert engine.version == 1 and torch.allclose(logits(engine.model), logits(policy), atol=1e-6)
        other = save_adapter(load_model(tiny_dir, lora=LoraSection(rank=8, alpha=8)), tmp_path / "r8")
        with pytest.raises(ValueError, match="rank 8.*holds rank 4"):
            engine.update_adapter(other, 2)
        partial = save_adapter(policy, tmp_path / "partial")
        tensors = load_file(str(partial / ADAPTER_WEIGHTS))
        from safetensors.torch import save_file

        save_file(dict(list(tensors.items())[1:]), str(partial / ADAPTER_WEIGHTS))
        with pytest.raises(ValueError, match="do not fit the model"):
            engine.update_adapter(partial, 2)
        assert engine.version == 1 and engine.broken is None
        assert torch.allclose(logits(engine.model), logits(policy), atol=1e-6)
    finally:
        asyncio.run(engine.close())


def test_a_whole_model_loaded_into_an_engine_holding_an_adapter_leaves_nothing_of_it(tiny_dir, tmp_path):
    """A served engine that held an adapter, then given a whole model (another run, training every
    weight): it computes that model, the adapter gone (not left on over the new weights)."""
    from rstar2.engines.hf import HFEngine

    engine = HFEngine(load_model(tiny_dir), max_batch_size=2)
    try:
        policy = moved(load_model(tiny_dir, lora=LoraSection(**LORA)))
        engine.update_adapter(save_adapter(policy, tmp_path / "v1"), 1)
        other = load_model(tiny_dir)
        with torch.no_grad():
            for p in other.parameters():
                p.mul_(1.01)
        engine.update_weights(other.state_dict(), 2)
        assert not any(".lora_" in k for k in engine.model.state_dict())
        assert torch.allclose(logits(engine.model), logits(other), atol=1e-6)
    finally:
        asyncio.run(engine.close())
