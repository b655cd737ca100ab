"""Config files: YAML read and edited (``--set section.key=value`` overrides single values, a list
of named items entered by name), then validated into ``config.py``'s settings with errors that name
each bad key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from .config import RLConfig, SFTConfig, TrainConfig


class ConfigError(ValueError):
    """A config file that cannot be used; the message says which key and why."""


def set_value(tree: dict[str, Any], dotted: str) -> None:
    """Apply one ``--set key.sub=value`` (the value is read as YAML). In a list of named items
    (a recipe's ``stages``), the next key picks the item by name: ``stages.rl-1.run.steps=5``."""
    if "=" not in dotted:
        raise ConfigError(f"--set expects key=value (e.g. optim.lr=1e-5), got {dotted!r}")
    key, raw = dotted.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {dotted}: the value is not YAML ({exc.__class__.__name__})") from None
    put(tree, key, value)


def put(tree: dict[str, Any], key: str, value: Any) -> None:
    """``tree[a][b] = value`` for ``key`` "a.b" (a list of named items is entered by name)."""
    node: Any = tree
    parts = key.strip().split(".")
    for i, p in enumerate(parts[:-1]):
        if isinstance(node, list):
            node = next((x for x in node if isinstance(x, dict) and x.get("name") == p), None)
            if node is None:
                raise ConfigError(f"--set {key}: no {parts[i - 1].removesuffix('s')} named {p!r}")
            continue
        node = node.setdefault(p, {})
        if not isinstance(node, (dict, list)):
            raise ConfigError(f"--set {key}: {p!r} is not a section")
    if isinstance(node, list):
        raise ConfigError(f"--set {key}: name an item of {parts[-2]!r} before its key")
    node[parts[-1]] = value


def validate(cls: type[BaseModel], tree: dict[str, Any], what: str) -> Any:
    """``cls`` from ``tree``, or a ``ConfigError`` listing every bad key with its dotted path."""
    try:
        return cls.model_validate(tree)
    except ValidationError as exc:
        lines = []
        for e in exc.errors():
            where, msg = ".".join(str(x) for x in e["loc"]), e["msg"].removeprefix("Value error, ")
            if e["type"] == "extra_forbidden":  # a typo, or a key written where it does not live
                msg = "unknown key"
            lines.append(f"  {where}: {msg}" if where else f"  {msg}")
        raise ConfigError(f"invalid {what}:\n" + "\n".join(lines)) from None


def read_yaml(path: str | Path, what: str, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """The mapping in a YAML file, with ``--set`` overrides applied; clear errors otherwise."""
    path = Path(path)
    try:
        with path.open(encoding="utf-8") as fh:  # read from the file, its errors name it
            tree = yaml.safe_load(fh) or {}
    except FileNotFoundError:
        raise ConfigError(f"{what} file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path} is a folder, not a YAML file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{path} must hold a mapping of sections (model:, ...)")
    for o in overrides:
        set_value(tree, o)
    return tree


def parse_config(tree: dict[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    tree = dict(tree)
    for o in overrides:
        set_value(tree, o)
    kind = tree.get("kind", "rl")
    cls = {"rl": RLConfig, "sft": SFTConfig}.get(kind)
    if cls is None:
        raise ConfigError(f"kind must be 'rl' or 'sft', got {kind!r}")
    return validate(cls, tree, f"{kind} config")


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    return parse_config(read_yaml(path, "config", overrides))


def dump_config(cfg: BaseModel) -> str:
    """A config (or a recipe) as YAML, every default written out."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
