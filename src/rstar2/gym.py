"""Problems from reasoning-gym (PyPI ``reasoning-gym``, the optional extra ``rstar2[gym]``): over a
hundred procedural tasks, each with its own generator and its own scorer, seeded and offline.

A drawn problem is a row like any other (``problem``, ``answer``) that also carries what the task's
scorer needs (``gym``: the task, its config and the generator's whole entry), so a run folder's
``train.jsonl`` or ``problems.jsonl`` reproduces the run and is checked the same way when read back.
Which check decides a row's reward is ``scored_by_task``'s rule; the check itself runs in the
verifier's time-boxed processes (``rstar2.reward.checker``), as a CAS check does.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any
from urllib.parse import parse_qsl

import yaml

from .config import ConfigError, GymSection, validate

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
    for key, raw in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        (options if key in ("size", "seed", "score") else config)[key] = yaml.safe_load(raw)
    tasks = [{"name": n, "config": config} for n in names.split("+") if n]
    return validate(GymSection, {"tasks": tasks, **options}, f"problem source {source!r}")


def source_name(spec: GymSection) -> str:
    """A short name for folders and tables: ``gym-TASK`` (tasks joined by ``+``)."""
    return "gym-" + "+".join(t.name for t in spec.tasks)


def check_tasks(spec: GymSection) -> None:
    """reasoning-gym installed and every task known, before anything runs."""
    known = _reasoning_gym().factory.DATASETS
    unknown = [t.name for t in spec.tasks if t.name not in known]
    if unknown:
        raise ConfigError(f"unknown reasoning-gym tasks {unknown}; known: {', '.join(sorted(known))}")


def draw(spec: GymSection) -> list[dict[str, Any]]:
    """``spec.size`` problems of the tasks, mixed by weight (reasoning-gym's own composite dataset),
    each a row that carries its scorer's inputs."""
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
        # as a run folder keeps it, so that it is scored alike in this run and after a resume: tuples
        # become lists, and what JSON cannot hold is written as text (gsm_symbolic's Fractions, in
        # metadata its scorer does not read)
        rows.append(json.loads(json.dumps(row, default=str)))
    return rows


def scored_by_task(gym: dict[str, Any] | None, reference: str) -> bool:
    """Whether the task's own scorer decides (else rstar2's verifier): ``score: auto`` leaves plain
    numbers to the verifier (which reads ``1,000`` and ``2.50`` as the numbers they are, where a task's
    scorer may take the first digits it sees) and gives the task everything else: weekdays, lists,
    times, fractions and equations in the form the task asks for."""
    if not gym:
        return False
    score = gym.get("score", "auto")
    return score == "task" or (score == "auto" and not _PLAIN_NUMBER.fullmatch(reference.strip()))


@functools.lru_cache(maxsize=64)
def _scorer(task: str, config: str) -> Any:
    return _reasoning_gym().create_dataset(task, size=1, seed=0, **json.loads(config)).score_answer


def task_score(gym: dict[str, Any], answer: str) -> float:
    """The task's ``score_answer`` of ``answer`` (an extracted final answer), in [0, 1]; reasoning-gym
    gives partial credit (0.01 for a wrong number, 0.05 for a weekday in lower case), and the reward
    counts only 1.0 as correct."""
    score = _scorer(gym["task"], json.dumps(gym.get("config", {}), sort_keys=True))
    return float(score(answer=answer, entry=gym["entry"]))
