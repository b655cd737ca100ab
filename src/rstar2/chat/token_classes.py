"""Which class each response token belongs to (``code``, ``answer``, ``reflection`` right after a tool
response, else ``reasoning``): for the trainer's entropy per class and ``rstar2 analyze entropy``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import groupby
from typing import Any

from ..config import DEFAULT_RUN
from .tags import ANSWER_CLOSE, ANSWER_OPEN, TOOL_CALL_CLOSE, TOOL_CALL_OPEN

CLASSES = ("reasoning", "reflection", "code", "answer")
NO_CLASS = -1  # a tool-response token: not the model's, no class
_BLOCKS = (("code", TOOL_CALL_OPEN, TOOL_CALL_CLOSE), ("answer", ANSWER_OPEN, ANSWER_CLOSE))
_BLOCK_RE = re.compile(
    "|".join(f"(?P<{kind}>{re.escape(o)}.*?(?:{re.escape(c)}|\\Z))" for kind, o, c in _BLOCKS), re.DOTALL
)


def block_regions(text: str) -> list[tuple[int, int, str | None]]:
    """Character spans of ``<tool_call>…</tool_call>`` (code) and ``<answer>…</answer>`` blocks,
    tags included; an unclosed block runs to the end of the text."""
    return [(m.start(), m.end(), m.lastgroup) for m in _BLOCK_RE.finditer(text)]


def classify(
    pieces: Sequence[str], mask: Sequence[int], window: int = DEFAULT_RUN.reflection_window
) -> list[str | None]:
    """A class for each response token: ``None`` for tool tokens; ``code`` or ``answer`` for tokens
    touching such a block; ``reflection`` for the first ``window`` model tokens after a tool response."""
    if len(mask) != len(pieces):
        raise ValueError(f"{len(pieces)} token pieces but {len(mask)} mask values")
    out: list[str | None] = []
    after_tool = False
    for model, run in groupby(zip(pieces, mask, strict=True), key=lambda pair: bool(pair[1])):
        run_pieces = [piece for piece, _ in run]
        if not model:
            out += [None] * len(run_pieces)
            after_tool = True
            continue
        regions = block_regions("".join(run_pieces))
        pos = 0
        for k, piece in enumerate(run_pieces):
            start, end = pos, pos + len(piece)
            pos = end
            kind = next(
                (r for a, b, r in regions if (start < b and end > a) or (start == end and a <= start < b)),
                None,
            )
            out.append(kind or ("reflection" if after_tool and k < window else "reasoning"))
    return out


class TokenClasses:
    """Class indices (into ``CLASSES``; ``NO_CLASS`` for tool tokens) of a response's tokens; pieces
    decoded once per token id and cached, so a step costs a lookup per token, not a ``decode``."""

    def __init__(self, tokenizer: Any, window: int = DEFAULT_RUN.reflection_window) -> None:
        self.tokenizer, self.window = tokenizer, window
        self._pieces: dict[int, str] = {}

    def piece(self, token_id: int) -> str:
        if (p := self._pieces.get(token_id)) is None:
            p = self._pieces[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return p

    def __call__(self, response_ids: Sequence[int], mask: Sequence[int]) -> list[int]:
        names = classify([self.piece(i) for i in response_ids], mask, self.window)
        return [NO_CLASS if c is None else CLASSES.index(c) for c in names]
