"""Find the final answer in a model's response.

The paper's format puts the answer in ``\\boxed{}`` inside one ``<answer>…</answer>`` block;
``strict`` mode reads only that. ``lenient`` mode is for other models' outputs and for baselines:
the last boxed anywhere, a response that is itself a short answer, "the final answer is …", then
the last sentence: its last math span (``$…$``, ``\\(…\\)``, ``\\[…\\]``), else what follows its
last "is" / "are" / "=" / "equals", else its last number. Every scan here is linear in the
response length (the sentence rules read only the last 2,000 characters), so 10 MB responses or
10,000 unclosed ``\\boxed{`` cost milliseconds.
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
_NUMBER_RE = re.compile(r"-?\d+\s*/\s*\d+|-?\d+(?:(?:,|\{,\})\d{3})*(?:\.\d+)?|-?\.\d+")
_WORDS_AFTER_RE = re.compile(r"(?:\s+[A-Za-z]{2,}[A-Za-z/]*){1,3}(?=\s*(?:[.,;!?]|$))")
_MAX_FALLBACK_CHARS = 200
# math spans of a sentence: $$…$$, $…$, \(…\), \[…\] (a "$" followed by a digit and no closing
# "$" is a currency sign, not a span)
_SPAN_RE = re.compile(r"\$\$(.+?)\$\$|\$([^$]+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
# the words that introduce a stated result: "... is 42", "... are 5 and 7", "... = 1/6"
_CUE_RE = re.compile(r"(?:\bis|\bare|\bequals?|\bgives?|\bget|\bbe|=|:)\s+", re.IGNORECASE)
# what ends the result after a cue: ", reached when ...", "; so ...", " since ...", " because ..."
_RESULT_END_RE = re.compile(
    r"[,;]\s+(?=[A-Za-z]{3,})|\s+(?:since|because|which|when|where|so|for|as|with)\b|\.\s|\.$"
)
_FILLER_RE = re.compile(
    r"^(?:(?:therefore|thus|hence|then|just|exactly|simply|now|equal to|about|the value|:)\s*)+",
    re.IGNORECASE,
)
_SENTENCE_END_RE = re.compile(r"(?<!\d)\.(?:\s+|$)|\.(?=\s+[A-Z])|[!?](?:\s+|$)|\n+")


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
    """The last number, with up to three words after it ("42 stickers left", "12 dozen eggs"):
    units are dropped when comparing, words that change the value ("6 squared") are not."""
    tail = text[-500:].strip()
    found = None
    for m in _NUMBER_RE.finditer(tail):
        found = m
    if found is None:
        return None
    words = _WORDS_AFTER_RE.match(tail, found.end())
    return (found.group(0).rstrip(",") + (words.group(0) if words else "")).strip()


def _short_answer(text: str) -> str | None:
    """The text itself when it reads as an answer ("x >= 3", "2 and 3", "12 cm", a matrix), not
    as a sentence."""
    short = strip_delimiters(text.replace("**", "").strip())
    if short and len(short) <= _MAX_FALLBACK_CHARS and not _looks_like_prose(short):
        return short.rstrip(".").strip() or None
    return None


def _last_sentence(text: str) -> str:
    """The last sentence that states something: holds a digit, a math span or a LaTeX command."""
    tail = text[-2000:].replace("**", "")
    parts = [p.strip() for p in _SENTENCE_END_RE.split(tail)]
    for part in reversed(parts):
        if part and re.search(r"[\d$\\]", part):
            return part
    return ""


def _stated_result(sentence: str) -> str | None:
    """From the last sentence: its last math span, else the result after its last cue word
    ("is", "are", "=", "equals", ":"), cut where the prose goes on."""
    spans = [next(g for g in m.groups() if g is not None) for m in _SPAN_RE.finditer(sentence)]
    if spans:
        return spans[-1].strip() or None
    cues = list(_CUE_RE.finditer(sentence))
    if not cues:
        return None
    rest = _FILLER_RE.sub("", sentence[cues[-1].end() :])
    end = _RESULT_END_RE.search(rest)
    result = (rest[: end.start()] if end else rest).strip().rstrip(".").strip()
    if result and len(result) <= _MAX_FALLBACK_CHARS and not _looks_like_prose(result):
        return result
    return None


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


def _lenient_scope(text: str) -> str | None:
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    phrase = _final_answer_phrase(text.replace("**", ""))
    if phrase is not None:
        inner = last_boxed(phrase)
        return inner if inner is not None else phrase
    short = _short_answer(text)
    if short is not None:
        return short
    sentence = _last_sentence(text)
    stated = _stated_result(sentence) if sentence else None
    if stated is not None:
        return stated
    return _bare_final_number(sentence or text)


def extract_answer(response: str, mode: Mode = "strict") -> str | None:
    """The final answer as written by the model, or None when there is none to grade.

    ``strict``: only the last ``<answer>…</answer>`` block counts (a response cut before
    ``</answer>`` has no answer); inside it the last ``\\boxed{}`` wins, else the block's short
    text, else "answer is …", else its last number.
    ``lenient``: the answer block if there is one, else the last boxed anywhere, else the
    response itself when it is a short answer, else "final answer is …", else the result stated
    in the last sentence (its last math span, or what follows "is" / "=" …), else its last number.
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
    return _lenient_scope(response)
