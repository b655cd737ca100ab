"""Every option of every command, walked from the CLI's own definitions (a new option is covered the
day it is added): a number outside its bounds, of the wrong type, a path that is missing or of the
wrong kind is refused as it is parsed, exit 2 with one error naming the option, no traceback, before
any work starts. A number without bounds fails here unless it is justified below; so does every
numeric setting of the config schema, whose values `--set` and config files give."""

from __future__ import annotations

import subprocess
import types
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import pytest
import typer
import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError
from typer.testing import CliRunner

from rstar2.bounds import Above
from rstar2.cli import app
from rstar2.config import ClusterSection, RLConfig, SFTConfig
from rstar2.recipe.spec import Recipe

from .conftest import ROOT, RSTAR2

ROOT_COMMAND = typer.main.get_command(app)
HUGE = 10**12
# (command, option) -> why any number is meaningful there; keep it short
UNBOUNDED: dict[tuple[str, str], str] = {}
# (command, parameter) -> why a path there may be a file or a folder
EITHER_KIND = {("view", "target"): "a run folder or a trajectories JSONL file"}
# config settings -> why any number is meaningful there
UNBOUNDED_SETTINGS = {
    "LossSection.entropy_coef": "its sign chooses an entropy bonus (> 0) or penalty (< 0)",
}


def commands(cmd: Any = ROOT_COMMAND, path: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
    subs = getattr(cmd, "commands", None)
    if subs is None:
        return [(" ".join(path), cmd)]
    return [c for name, sub in subs.items() for c in commands(sub, (*path, name))]


def params(kind: str) -> list[tuple[str, Any, Any]]:
    """(command, its click command, parameter) for every number or path parameter."""
    found = []
    for name, cmd in commands():
        for p in cmd.params:
            d = getattr(p, "type_descriptor", None)
            if d is None:
                continue
            number = d.annotation in (int, float) and not d.is_list
            if (kind == "number" and number) or (kind == "path" and d.is_path):
                found.append((name, cmd, p))
    return found


def bounds(p: Any) -> tuple[float | None, bool, float | None]:
    """(lowest, whether the lowest itself is refused, highest) of a number option."""
    parser = p.type_descriptor.parameter_info.parser
    if isinstance(parser, Above):
        return parser.low, True, parser.high
    return p.min, False, p.max


def outside(p: Any) -> list[str]:
    """The values a number option must refuse: just outside its bounds, and of 0, -1 and a huge
    number those that are outside them too; a word always."""
    kind = p.type_descriptor.annotation
    low, open_low, high = bounds(p)
    step = 1 if kind is int else 0.5
    tried = [x for x in (low if open_low else None, None if low is None else low - step) if x is not None]
    tried += [0, -1, HUGE] + ([] if high is None else [high + step])

    def refused(x: float) -> bool:
        return (low is not None and (x < low or (open_low and x == low))) or (high is not None and x > high)

    return sorted({kind(x) for x in tried if refused(x)}, key=str) + ["abc"]


def label(case: tuple) -> str:
    return f"{case[0]} {case[2].opts[0]}"


def filled(cmd: Any, skip: Any, tmp: Path) -> list[str]:
    """Valid values for the command's other required parameters, so that only ``skip``'s is wrong."""
    args: list[str] = []
    for p in cmd.params:
        if p is skip or not p.required:
            continue
        d = p.type_descriptor
        if d.is_path:
            value = str(tmp / ("folder" if not d.parameter_info.file_okay else "file.yaml"))
        elif d.choices:
            value = str(getattr(d.choices[0], "value", d.choices[0]))
        elif d.annotation in (int, float):
            value = str(p.min if p.min is not None else 1)
        else:
            value = "x"
        args += [value] if p.param_type_name == "argument" else [p.opts[0], value]
    return args


def refused_at_parse(cmd: Any, name: str, p: Any, value: str, tmp: Path) -> None:
    """``value`` for ``p`` is refused as the command line is parsed (``make_context`` runs nothing),
    and the command as a user runs it says so once, naming the option, and exits 2."""
    given = [value] if p.param_type_name == "argument" else [f"{p.opts[0]}={value}"]
    args = filled(cmd, p, tmp)
    args = given + args if p.param_type_name == "argument" else args + given
    with pytest.raises(typer._click.exceptions.BadParameter):  # noqa: SLF001 - typer's own click
        cmd.make_context(name, list(args))
    run = CliRunner().invoke(app, [*name.split(), *args])
    said = run.output
    assert run.exit_code == 2 and isinstance(run.exception, SystemExit), (name, args, said)
    assert said.count("Error") == 1 and "Traceback" not in said, (name, args, said)
    assert f"'{p.opts[0]}'" in said or f"'{p.name}'" in said, (name, args, said)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("options")
    (tmp / "folder").mkdir()
    (tmp / "file.yaml").write_text("kind: rl\n")
    return tmp


@pytest.mark.parametrize("case", params("number"), ids=label)
def test_every_number_option_refuses_what_is_outside_its_bounds(case, tmp):
    name, cmd, p = case
    low, _, high = bounds(p)
    if low is None and high is None:
        assert (name, p.opts[0]) in UNBOUNDED, (
            f"{name} {p.opts[0]}: give it bounds (min=, max=, bounds.above)"
        )
    for value in outside(p):
        refused_at_parse(cmd, name, p, str(value), tmp)


@pytest.mark.parametrize("case", params("path"), ids=label)
def test_every_path_option_refuses_a_missing_path_or_one_of_the_wrong_kind(case, tmp):
    name, cmd, p = case
    info = p.type_descriptor.parameter_info
    if info.file_okay and info.dir_okay:
        assert (name, p.name) in EITHER_KIND, f"{name} {p.opts[0]}: say whether it is a file or a folder"
    wrong = [str(tmp / "missing")] if info.exists else []
    wrong += [] if info.file_okay else [str(tmp / "file.yaml")]
    wrong += [] if info.dir_okay else [str(tmp / "folder")]
    for value in wrong:
        refused_at_parse(cmd, name, p, value, tmp)


def test_the_walk_reaches_every_command():
    names = {name for name, _ in commands()}
    assert {"serve", "eval", "chat", "train", "sandbox serve", "sandbox worker", "launch-node"} <= names
    numbers = {label(c) for c in params("number")}
    assert {"eval --samples", "eval --limit", "serve --max-batch-size", "sandbox serve --port"} <= numbers


# ------------------------------------------------------------------------------ the config schema
def numeric_fields(model: type[BaseModel], seen: set | None = None) -> list[tuple[str, Any]]:
    """(Section.field, FieldInfo) for every int or float setting under ``model``, sections within."""
    seen = set() if seen is None else seen
    if model in seen:
        return []
    seen.add(model)
    found = []
    for name, field in model.model_fields.items():
        kinds, inner = [], [field.annotation]
        while inner:  # Optional[X], list[X]: X
            k = inner.pop()
            if get_origin(k) in (Union, types.UnionType, list):
                inner += get_args(k)
            else:
                kinds.append(k)
        for k in kinds:
            if isinstance(k, type) and issubclass(k, BaseModel):
                found += numeric_fields(k, seen)
            elif k in (int, float):
                found.append((f"{model.__name__}.{name}", field))
    return found


SETTINGS = sorted(
    {key: f for m in (RLConfig, SFTConfig, Recipe, ClusterSection) for key, f in numeric_fields(m)}.items()
)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s[0])
def test_every_numeric_setting_has_bounds(setting):
    key, field = setting
    limits = {k: getattr(m, k) for m in field.metadata for k in ("gt", "ge", "lt", "le") if hasattr(m, k)}
    if not limits:
        assert key in UNBOUNDED_SETTINGS, f"{key}: give it bounds (Field(ge=, gt=, le=, lt=))"
        return
    typed = TypeAdapter(Annotated[(field.annotation, *field.metadata)])
    step = 1 if int in (field.annotation, *get_args(field.annotation)) else 0.5
    wrong = [limits["gt"]] if "gt" in limits else [limits["ge"] - step] if "ge" in limits else []
    wrong += [limits["lt"]] if "lt" in limits else [limits["le"] + step] if "le" in limits else []
    for value in wrong:
        with pytest.raises(ValidationError):
            typed.validate_python(value)


# ---------------------------------------------------------- what the tester found, end to end
def test_a_setting_out_of_bounds_in_a_config_or_set_is_one_error_line_and_exit_2(tmp_path, tiny_dir):
    """A config's zero steps, zero samples or negative limit, given in the file or by --set, is
    refused before anything runs: exit 2, one error line naming the setting, no run folder."""
    (tmp_path / "p.jsonl").write_text('{"problem": "1 + 1", "answer": "2"}\n')
    rl = {"kind": "rl", "model": {"path": str(tiny_dir)}, "data": {"train": str(tmp_path / "p.jsonl")}}
    rl["run"] = {"out": str(tmp_path / "run"), "steps": 0}
    (tmp_path / "rl.yaml").write_text(yaml.safe_dump(rl))
    cases = {
        "run.steps": ["train", str(tmp_path / "rl.yaml")],
        "data.limit": ["train", str(tmp_path / "rl.yaml"), "--set", "run.steps=1", "--set", "data.limit=-1"],
        "rollout.samples": [
            "train",
            str(tmp_path / "rl.yaml"),
            "--set",
            "run.steps=1",
            "--set",
            "rollout.samples=0",
        ],
    }
    for key, args in cases.items():
        run = subprocess.run([*RSTAR2, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
        said = " ".join(run.stderr.split())
        assert run.returncode == 2 and key.split(".")[-1] in said, (args, said[-2000:])
        assert sum(x.startswith("error:") for x in run.stderr.splitlines()) == 1, (args, said[-2000:])
        assert "Traceback" not in said, (args, said[-2000:])
    assert not (tmp_path / "run").exists()
