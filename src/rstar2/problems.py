"""Problem sets: the benchmarks shipped with the package (``data/README.md`` says where they come
from) and any JSON Lines file of ``problem``/``answer`` rows. Training, recipes and evaluation all
read their problems through here."""

from __future__ import annotations

from pathlib import Path

from .jsonl import iter_jsonl

DATA_DIR = Path(__file__).parent / "data"
# each in data/NAME.jsonl; paraphrased: new wording for the generator's skills, each row with its
# program; transfer: situations no training generator writes (scripts/make_transfer_set.py)
BENCHMARKS = ("aime2024", "aime2025", "hmmt_feb_2025", "math500", "amc2023", "paraphrased", "transfer")
ALIASES = {"aime24": "aime2024", "aime25": "aime2025", "hmmt25": "hmmt_feb_2025", "amc23": "amc2023"}


def load_benchmark(name_or_path: str) -> list[dict]:
    """Rows (``id``, ``problem``, ``answer``, ...) of a shipped set, or of any JSON Lines file."""
    name_or_path = ALIASES.get(name_or_path, name_or_path)
    path = DATA_DIR / f"{name_or_path}.jsonl" if name_or_path in BENCHMARKS else Path(name_or_path)
    if not path.exists():
        known = ", ".join(BENCHMARKS)
        raise FileNotFoundError(
            f"no benchmark {name_or_path!r}: use one of {known} (or {', '.join(ALIASES)}), or a .jsonl path"
        )
    rows = []
    for n, row in iter_jsonl(path):
        if not isinstance(row, dict) or "problem" not in row or "answer" not in row:
            raise ValueError(f"{path}:{n}: each row needs 'problem' and 'answer'")
        rows.append(row)
    return rows
