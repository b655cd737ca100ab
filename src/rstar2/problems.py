"""Problem sets, from wherever users keep them (shipped benchmarks, JSON Lines, JSON, parquet, a
`datasets` folder, reasoning-gym's tasks), all read through ``load_problems``. Every row comes back
with ``problem`` and ``answer`` (a string), its other columns kept; ``Columns`` says where they are
when a file names them otherwise (verl's layout is found without being told)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from . import gym
from .config import Columns, DataSection, GymSection
from .jsonl import iter_jsonl

DATA_DIR = Path(__file__).parent / "data"
# each in data/NAME.jsonl; paraphrased: new wording for the generator's skills, each row with its
# program; transfer: situations no training generator writes (scripts/make_transfer_set.py)
BENCHMARKS = ("aime2024", "aime2025", "hmmt_feb_2025", "math500", "amc2023", "paraphrased", "transfer")
ALIASES = {"aime24": "aime2024", "aime25": "aime2025", "hmmt25": "hmmt_feb_2025", "amc23": "amc2023"}
PROBLEM_COLUMNS = ("problem", "question", "prompt")
ANSWER_COLUMNS = ("answer", "ground_truth", "reward_model.ground_truth")
A_LIST = "a .json file of problems holds a list of rows"
FORMATS = "a .jsonl, .json or .parquet file, a `datasets` folder (save_to_disk), or gym:TASK"


def _gym_spec(source: str | GymSection) -> GymSection | None:
    """The reasoning-gym draw a source names, if it names one."""
    if isinstance(source, GymSection):
        return source
    return gym.parse_source(source) if gym.is_gym(source) else None


def source_name(source: str | GymSection) -> str:
    """A short name for a source's folder and table row: the benchmark, the file's stem, ``gym-TASK``."""
    if (spec := _gym_spec(source)) is not None:
        return gym.source_name(spec)
    name = ALIASES.get(source, source)
    return name if name in BENCHMARKS else Path(name.rstrip("/")).stem


def _path(source: str) -> Path:
    """The file or folder behind ``source``: a shipped benchmark's, or the path given, which must exist."""
    name = ALIASES.get(source, source)
    if name in BENCHMARKS:
        return DATA_DIR / f"{name}.jsonl"
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(
            f"{source} does not exist: give {FORMATS}, or a shipped benchmark ({', '.join(BENCHMARKS)}, "
            f"or {', '.join(ALIASES)})"
        )
    return path


def check_source(source: str | GymSection, columns: Columns | None = None) -> None:
    """Before a model is loaded or a run folder written: every row of the file or folder reads and
    has its columns, or reasoning-gym is there and takes each task's config."""
    if (spec := _gym_spec(source)) is not None:
        gym.check_tasks(spec, configs=True)
    else:
        load_problems(source, columns)


def load_problems(source: str | GymSection, columns: Columns | None = None) -> list[dict[str, Any]]:
    """The rows of ``source`` (see the module's docstring), each with ``problem`` and ``answer``;
    an error names the file and the column it lacks, or the file that holds no problem."""
    if (spec := _gym_spec(source)) is not None:
        return gym.draw(spec)
    path, columns = _path(source), columns or Columns()
    raw = _read(path, columns.split)
    if not raw:
        raise ValueError(f"{path}: no problems in it")
    return [_row(path, n, r, columns) for n, r in raw]


def training_problems(data: DataSection) -> list[dict[str, Any]]:
    """An RL config's problems (``data:``), up to ``data.limit``."""
    return load_problems(data.gym or data.train, data.columns)[: data.limit]


def _read(path: Path, split: str | None) -> list[tuple[int | str, Any]]:
    """(row, value) of every row of the file or folder, rows numbered from 1 (a JSON Lines file's
    line numbers, so blank lines count)."""
    if path.is_dir():
        return list(enumerate(_dataset_rows(path, split), start=1))
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ImportError(f"{path}: reading parquet needs pip install 'rstar2[data]'") from None
        return list(enumerate(pq.read_table(path).to_pylist(), start=1))
    if path.suffix == ".json":
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            said = (
                f"{exc.msg} at line {exc.lineno} column {exc.colno}" if exc.doc.strip() else "an empty file"
            )
            raise ValueError(f"{path}: not valid JSON ({said}); {A_LIST}") from None
        if not isinstance(rows, list):
            raise ValueError(f"{path}: {A_LIST}")
        return list(enumerate(rows, start=1))
    return list(iter_jsonl(path))


def _dataset_rows(path: Path, split: str | None) -> list[dict[str, Any]]:
    """A `datasets` folder's rows (one split: ``split``, or the only one)."""
    try:
        import datasets
    except ImportError:
        raise ImportError(
            f"{path} is a folder: reading a `datasets` folder needs pip install 'rstar2[data]'"
        ) from None
    try:
        loaded = datasets.load_from_disk(str(path))
    except FileNotFoundError:
        raise ValueError(f"{path} is a folder but not one `datasets` saved (save_to_disk)") from None
    if isinstance(loaded, datasets.DatasetDict):
        names = list(loaded)
        if split is None and len(names) != 1:
            raise ValueError(f"{path} holds the splits {names}: name one with columns.split")
        if split is not None and split not in loaded:
            raise ValueError(f"{path} has no split {split!r}; it holds {names}")
        loaded = loaded[split or names[0]]
    return loaded.to_list()


def _get(row: dict[str, Any], dotted: str) -> Any:
    """``row[a][b]`` for ``a.b``; a missing key gives ``KeyError``."""
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(dotted)
        value = value[part]
    return value


def _column(
    path: Path, where: int | str, row: dict[str, Any], given: str | None, defaults: tuple, role: str
) -> Any:
    for name in [given] if given else defaults:
        with contextlib.suppress(KeyError):
            return _get(row, name)
    shown = f"column {given!r}" if given else f"column named {' or '.join(map(repr, defaults))}"
    raise ValueError(
        f"{path} (row {where}): no {shown} for the {role}; it has {', '.join(map(repr, row))}: "
        f"name the {role}'s column with columns.{role} (data.columns in a config)"
    )


def _as_problem(value: Any) -> str | None:
    """A problem's text: a string, or the last user message of a chat (verl's ``prompt``)."""
    if isinstance(value, list):
        users = [m.get("content") for m in value if isinstance(m, dict) and m.get("role") == "user"]
        value = users[-1] if users else None
    return value if isinstance(value, str) else None


def _row(path: Path, where: int | str, row: Any, columns: Columns) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise ValueError(f"{path} (row {where}): a problem is a mapping of columns, got {type(row).__name__}")
    problem = _column(path, where, row, columns.problem, PROBLEM_COLUMNS, "problem")
    answer = _column(path, where, row, columns.answer, ANSWER_COLUMNS, "answer")
    text = _as_problem(problem)
    if text is None:
        raise ValueError(
            f"{path} (row {where}): the problem's column holds neither text nor a chat with a user message"
        )
    if answer is None or isinstance(answer, (dict, list)):
        raise ValueError(f"{path} (row {where}): the answer's column holds {answer!r}, not an answer")
    return {**row, "problem": text, "answer": str(answer)}
