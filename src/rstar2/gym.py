"""Problems from reasoning-gym (``rstar2[gym]``): procedural tasks with their own generators and
scorers, seeded and offline. A drawn row also carries what its scorer needs (``gym``: the task, its
config, the whole entry), so a run folder's ``train.jsonl`` or ``problems.jsonl`` reproduces the run
and is checked the same way when read back."""

from __future__ import annotations

import functools
import json
import re
from typing import Any
from urllib.parse import parse_qsl

import yaml

from .config import GymSection
from .config_files import ConfigError, validate

PREFIX = "gym:"
INSTALL = "pip install 'rstar2[gym]' (reasoning-gym)"
# a reference the math verifier decides: a plain number (the task's scorer would read "1,000" as 1)
_PLAIN_NUMBER = re.compile(r"-?\d+(\.\d+)?")


def _reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise ImportError(f"problems from reasoning-gym need it installed: {INSTALL}") from None
    return reasoning_gym


def is_gym(source: str) -> bool:
    return source.startswith(PREFIX)


def parse_source(source: str) -> GymSection:
    """``gym:TASK[+TASK...][?size=N&seed=S&score=auto&KEY=VALUE...]``: the tasks (equal weights), the
    draw's size and seed, and any other key as the tasks' config (values read as YAML)."""
    names, _, query = source.removeprefix(PREFIX).partition("?")
    options: dict[str, Any] = {}
    config: dict[str, Any] = {}
    try:
        for key, raw in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
            (options if key in ("size", "seed", "score") else config)[key] = yaml.safe_load(raw)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"problem source {source!r}: write it as gym:TASK?KEY=VALUE&... ({exc})") from None
    tasks = [{"name": n, "config": config} for n in names.split("+") if n]
    return validate(GymSection, {"tasks": tasks, **options}, f"problem source {source!r}")


def source_name(spec: GymSection) -> str:
    """A short name for folders and tables: ``gym-TASK`` (tasks joined by ``+``)."""
    return "gym-" + "+".join(t.name for t in spec.tasks)


def check_tasks(spec: GymSection, configs: bool = False) -> None:
    """reasoning-gym installed and every task known, before anything runs; with ``configs``, each
    task's config taken by its generator too (one problem drawn: an unknown key or a value it
    refuses is said here, not after a model has loaded)."""
    rg = _reasoning_gym()
    known = rg.factory.DATASETS
    unknown = [t.name for t in spec.tasks if t.name not in known]
    if unknown:
        raise ConfigError(f"unknown reasoning-gym tasks {unknown}; known: {', '.join(sorted(known))}")
    for task in spec.tasks if configs else ():
        try:
            rg.create_dataset(task.name, size=1, seed=spec.seed, **task.config)
        except Exception as exc:  # noqa: BLE001 - whatever a task's config class refuses with
            options = ", ".join(f"{k}={v}" for k, v in task.config.items()) or "none"
            raise ConfigError(
                f"reasoning-gym task {task.name} refuses its config ({options}): {exc}"
            ) from None


def draw(spec: GymSection) -> list[dict[str, Any]]:
    """``spec.size`` problems of the tasks mixed by weight, each a row carrying its scorer's inputs."""
    rg = _reasoning_gym()
    check_tasks(spec)
    configs = {t.name: t.config for t in spec.tasks}
    if len(spec.tasks) == 1:
        task = spec.tasks[0]
        dataset = rg.create_dataset(task.name, size=spec.size, seed=spec.seed, **task.config)
    else:
        from reasoning_gym.composite import DatasetSpec

        mixture = [DatasetSpec(t.name, t.weight, t.config) for t in spec.tasks]
        dataset = rg.create_dataset("composite", size=spec.size, seed=spec.seed, datasets=mixture)
    rows = []
    for i, entry in enumerate(dataset):
        name = entry["metadata"].get("source_dataset", spec.tasks[0].name)
        row = {
            "id": f"{name}-{spec.seed}-{i}",
            "problem": entry["question"],
            "answer": str(entry["answer"]),
            "source": f"{PREFIX}{name}",
            "gym": {"task": name, "config": configs[name], "score": spec.score, "entry": entry},
        }
        # as a run folder keeps it, scored alike now and after a resume: tuples become lists, what
        # JSON cannot hold is text (gsm_symbolic's Fractions, in metadata its scorer does not read)
        rows.append(json.loads(json.dumps(row, default=str)))
    return rows


def scored_by_task(gym: dict[str, Any] | None, reference: str) -> bool:
    """Whether the task's own scorer decides (else rstar2's verifier): ``score: auto`` leaves plain
    numbers to the verifier (a task's scorer may read ``1,000`` as 1) and gives the task the rest
    (weekdays, lists, times, fractions and equations in the form it asks for)."""
    if not gym:
        return False
    score = gym.get("score", "auto")
    return score == "task" or (score == "auto" and not _PLAIN_NUMBER.fullmatch(reference.strip()))


@functools.lru_cache(maxsize=64)
def _scorer(task: str, config: str) -> Any:
    return _reasoning_gym().create_dataset(task, size=1, seed=0, **json.loads(config)).score_answer


def task_score(gym: dict[str, Any], answer: str) -> float:
    """The task's ``score_answer`` of an extracted ``answer`` (partial credit; only 1.0 is correct)."""
    score = _scorer(gym["task"], json.dumps(gym.get("config", {}), sort_keys=True))
    return float(score(answer=answer, entry=gym["entry"]))
