"""Which class each response token belongs to (``code``, ``answer``, ``reflection`` right after a tool
response, else ``reasoning``): for the trainer's entropy per class and ``rstar2 analyze entropy``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..config import DEFAULT_RUN
from .tags import ANSWER_CLOSE, ANSWER_OPEN, TOOL_CALL_CLOSE, TOOL_CALL_OPEN

CLASSES = ("reasoning", "reflection", "code", "answer")
NO_CLASS = -1  # a tool-response token: not the model's, no class
_BLOCKS = (("code", TOOL_CALL_OPEN, TOOL_CALL_CLOSE), ("answer", ANSWER_OPEN, ANSWER_CLOSE))


def block_regions(text: str) -> list[tuple[int, int, str]]:
    """Character spans of ``<tool_call>…</tool_call>`` (code) and ``<answer>…</answer>`` blocks,
    tags included; an unclosed block runs to the end of the text."""
    regions, pos = [], 0
    while True:
        found = [(text.find(o, pos), o, c, k) for k, o, c in _BLOCKS]
        found = [f for f in found if f[0] >= 0]
        if not found:
            return regions
        start, open_tag, close_tag, kind = min(found)
        close = text.find(close_tag, start + len(open_tag))
        end = len(text) if close < 0 else close + len(close_tag)
        regions.append((start, end, kind))
        pos = end


def classify(
    pieces: Sequence[str], mask: Sequence[int], window: int = DEFAULT_RUN.reflection_window
) -> list[str | None]:
    """A class for each response token: ``None`` for tool tokens; ``code`` or ``answer`` for tokens
    touching such a block; ``reflection`` for the first ``window`` model tokens after a tool response."""
    n = len(pieces)
    if len(mask) != n:
        raise ValueError(f"{n} token pieces but {len(mask)} mask values")
    out: list[str | None] = [None] * n
    i, after_tool = 0, False
    while i < n:
        if not mask[i]:
            after_tool = True
            i += 1
            continue
        j = i
        while j < n and mask[j]:
            j += 1
        regions = block_regions("".join(pieces[i:j]))
        pos = 0
        for k in range(i, j):
            start, end = pos, pos + len(pieces[k])
            pos = end
            kind = next(
                (r for a, b, r in regions if (start < b and end > a) or (start == end and a <= start < b)),
                None,
            )
            out[k] = kind or ("reflection" if after_tool and k - i < window else "reasoning")
        i = j
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
