"""JSON Lines, read and written the same way everywhere. Inputs a person wrote are read ``strict``
(a line that is not JSON is an error naming file and line); files this system appends to are read
tolerantly (a last line cut by a kill is skipped: the resumed run redoes it). Lines split on ``\\n``
only, so other line separators inside a JSON string stay whole."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


def iter_jsonl(
    path: str | Path, *, strict: bool = True, skipped: list[int] | None = None
) -> Iterator[tuple[int, Any]]:
    """(line number, value) of every non-blank line. ``strict``: a line that does not parse raises
    ``ValueError("FILE:LINE: not JSON (…)")``; else it is skipped (its number added to ``skipped``)."""
    with open(path, encoding="utf-8", errors="strict" if strict else "replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as exc:
                if strict:
                    raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from None
                if skipped is not None:
                    skipped.append(n)


def read_jsonl(path: str | Path, *, strict: bool = True) -> list[Any]:
    return [value for _, value in iter_jsonl(path, strict=strict)]


def write_jsonl(rows: Iterable[Any], path: str | Path) -> Path:
    """All rows at once, through a temporary file: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)
    return path
