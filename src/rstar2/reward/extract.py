"""Find the final answer in a model's response.

The paper's format puts the answer in ``\\boxed{}`` inside one ``<answer>…</answer>`` block;
``strict`` mode reads only that. ``lenient`` mode is for other models' outputs: the last boxed
anywhere, then "the final answer is …", then a bare final number. Every scan here is linear in
the response length, so 10 MB responses or 10,000 unclosed ``\\boxed{`` cost milliseconds.
"""

from __future__ import annotations

import re
from typing import Literal

from .normalize import strip_delimiters

Mode = Literal["strict", "lenient"]

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*")
_FINAL_RE = re.compile(
    r"(?:final answer|the answer|answer)\s*(?:is|:|=)\s*:?\s*(.+?)\s*(?:$|\n|(?<![\d\\])\.(?:\s|$))",
    re.IGNORECASE,
)
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_MAX_FALLBACK_CHARS = 200


def matching_braces(text: str) -> dict[int, int]:
    """Map each ``{`` to its ``}`` in one pass (escaped ``\\{`` / ``\\}`` are literal text)."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2  # skip the escaped character (\{, \}, \\)
            continue
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            pairs[stack.pop()] = i
        i += 1
    return pairs


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{…}`` / ``\\fbox{…}`` (or ``\\boxed 5``) in ``text``."""
    starts = [m.end() for m in _BOX_RE.finditer(text)]
    if not starts:
        return None
    pairs = matching_braces(text)
    for start in reversed(starts):
        if start < len(text) and text[start] == "{":
            end = pairs.get(start)
            if end is not None:
                return text[start + 1 : end].strip()
        else:  # \boxed 5: one token up to whitespace or a delimiter
            m = re.match(r"[^\s$}\\]+", text[start:])
            if m:
                return m.group(0)
    return None


def answer_block(text: str) -> str | None:
    """Inside of the last closed ``<answer>…</answer>`` block, or None."""
    end = text.rfind("</answer>")
    if end < 0:
        return None
    start = text.rfind("<answer>", 0, end)
    if start < 0:
        return None
    return text[start + len("<answer>") : end]


def _looks_like_prose(s: str) -> bool:
    """Two words in a row outside LaTeX commands and ``\\text{}``: a sentence, not an answer."""
    bare = re.sub(r"\\[a-zA-Z]+(?:\{[^{}]*\})?", " ", s)
    return "\n" in s.strip() or re.search(r"[A-Za-z]{2,}\s+[A-Za-z]{2,}", bare) is not None


def _final_answer_phrase(text: str) -> str | None:
    tail = text[-2000:]
    found = None
    for m in _FINAL_RE.finditer(tail):
        found = m.group(1)
    if found is None:
        return None
    found = strip_delimiters(found.strip().rstrip("."))
    return found if 0 < len(found) <= _MAX_FALLBACK_CHARS else None


def _bare_final_number(text: str) -> str | None:
    tail = text[-500:].strip()
    numbers = _NUMBER_RE.findall(tail)
    return numbers[-1].rstrip(",") if numbers else None


def _from_scope(scope: str, whole_block: bool) -> str | None:
    boxed = last_boxed(scope)
    if boxed is not None:
        return boxed
    if whole_block:  # <answer>33</answer> or <answer>$\frac{1}{2}$</answer>
        short = strip_delimiters(scope)
        if short and len(short) <= _MAX_FALLBACK_CHARS and not _looks_like_prose(short):
            return short.rstrip(".").strip() or None
    phrase = _final_answer_phrase(scope)
    if phrase is not None:
        inner = last_boxed(phrase)
        return inner if inner is not None else phrase
    return _bare_final_number(scope)


def extract_answer(response: str, mode: Mode = "strict") -> str | None:
    """The final answer as written by the model, or None when there is none to grade.

    ``strict``: only the last ``<answer>…</answer>`` block counts (a response cut before
    ``</answer>`` has no answer); inside it the last ``\\boxed{}`` wins, else the block's short
    text, else "answer is …", else its last number.
    ``lenient``: the answer block if there is one, else the last boxed anywhere, else
    "final answer is …", else the last number of the response.
    """
    if mode not in ("strict", "lenient"):
        raise ValueError(f"mode must be 'strict' or 'lenient', not {mode!r}")
    block = answer_block(response)
    if block is not None:
        found = _from_scope(block, whole_block=True)
        if found is not None or mode == "strict":
            return found
    if mode == "strict":
        return None
    return _from_scope(response, whole_block=False)
