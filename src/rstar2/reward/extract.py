"""Find the final answer in a model's response: ``strict`` reads only the paper's format (the
``\\boxed{}`` of an ``<answer>`` block), ``lenient`` is for other models and baselines. Every scan is
linear in the response length, so 10 MB responses or 10,000 unclosed ``\\boxed{`` cost milliseconds."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterator
from typing import Literal

from ..chat.tags import ANSWER_CLOSE, ANSWER_OPEN
from ..config import DEFAULT_ROLLOUT
from .macros import matching_braces
from .normalize import strip_delimiters

Mode = Literal["strict", "lenient"]

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*")
_FINAL_RE = re.compile(
    r"(?:final answer|the answer|answer)\s*(?:is|:|=)\s*:?\s*(.+?)\s*(?:$|\n|(?<!\\)\.(?:\s|$))",
    re.IGNORECASE,
)
_NUMBER_RE = re.compile(r"-?\d+\s*/\s*\d+|-?\d+(?:(?:,|\{,\})\d{3})*(?:\.\d+)?|-?\.\d+")
_WORDS_AFTER_RE = re.compile(r"(?:\s+[A-Za-z]{2,}[A-Za-z/]*){1,3}(?=\s*(?:[.,;!?]|$))")
_MAX_FALLBACK_CHARS = 200
# math spans of a sentence: $$…$$, $…$, \(…\), \[…\] (a span needs its closing "$": a lone
# currency sign opens none)
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
_MATHS_RE = re.compile(r"[\d\\^_=<>+]|^[A-Za-z]$")
# a value then a few words, as units are written: "100 square units", "12 km per hour"
_VALUE_WITH_UNIT_RE = re.compile(r"[^A-Za-z]*\d[^A-Za-z]*(?:\s+[A-Za-z]{2,}[A-Za-z/]*){1,3}")
# markdown bold (**Answer:**, **42**), never Python's power operator (x**2 + y**2)
_BOLD_RE = re.compile(r"(?<![\w)\]}])\*\*(?=\S)(.+?)(?<=\S)\*\*(?![\w(\[{])")
_MATH_DOLLAR_RE = re.compile(r"(?<!\\)\$")  # a math span left inside (\$ is a currency sign)
_LEAD_WORD_RE = re.compile(r"^[A-Za-z]{2,}\s*[,:]")
_SENTENCE_END_RE = re.compile(r"(?<!\d)\.(?:\s+|$)|\.(?=\s+[A-Z])|[!?](?:\s+|$)|\n+")


def _unbold(text: str) -> str:
    return _BOLD_RE.sub(r"\1", text) if "**" in text else text


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{…}`` / ``\\fbox{…}`` (or ``\\boxed 5``) in ``text``."""
    starts = [m.end() for m in _BOX_RE.finditer(text)]
    if not starts:
        return None
    pairs = matching_braces(text)
    for start in reversed(starts):
        if start < len(text) and text[start] == "{":
            if (end := pairs.get(start)) is not None:
                return text[start + 1 : end].strip()
        else:  # \boxed 5: one token up to whitespace or a delimiter
            if m := re.match(r"[^\s$}\\]+", text[start:]):
                return m.group(0)
    return None


# what may stand between boxes of one listed answer: "\\boxed{2}, \\boxed{3}", "$\\boxed{k=45}$ \\quad
# \\text{and} \\quad $\\boxed{n=2}$"
_BETWEEN_BOXES_RE = re.compile(
    r"(?:\s|\$|,|;|&|\\[,;:! ]|\\q?quad\b|\\text\s*\{\s*(?:and|or|,)?\s*\}|\band\b|\bor\b)*"
)


def last_boxes(text: str) -> str | None:
    """Like ``last_boxed``, but boxes written in a row with only separators between them
    (``\\boxed{(1,2)}, \\boxed{(2,1)}``) are one listed answer, joined with ", "."""
    pairs = matching_braces(text)
    spans: list[tuple[int, int]] = []
    for m in _BOX_RE.finditer(text):
        if m.end() < len(text) and text[m.end()] == "{" and (end := pairs.get(m.end())) is not None:
            spans.append((m.start(), end))
    run = spans[-1:]
    for start, end in reversed(spans[:-1]):
        if end < run[0][0] and _BETWEEN_BOXES_RE.fullmatch(text, end + 1, run[0][0]):
            run.insert(0, (start, end))
        else:
            break
    if len(run) < 2:
        return last_boxed(text)
    contents = [text[text.index("{", start) + 1 : end].strip() for start, end in run]
    return ", ".join(c for c in contents if c) or None


# where a chat template starts or ends a turn: what a model writes after one is not its answer
_TURN_MARKERS_RE = re.compile(
    r"<\|im_start\|>|<\|im_end\|>|<\|endoftext\|>|<\|eot_id\|>|<\|start_header_id\|>|<\|end\|>"
    r"|<\|user\|>|<\|assistant\|>|<start_of_turn>|<end_of_turn>|</s>"
)


def cut_next_turn(text: str) -> str:
    """The response up to the first chat-template turn marker: a model writing the next turn ended its own."""
    m = _TURN_MARKERS_RE.search(text)
    return text[: m.start()] if m else text


def answer_block(text: str) -> str | None:
    """Inside of the last closed ``<answer>…</answer>`` block, or None."""
    end = text.rfind(ANSWER_CLOSE)
    start = text.rfind(ANSWER_OPEN, 0, end) if end >= 0 else -1
    return text[start + len(ANSWER_OPEN) : end] if start >= 0 else None


def _looks_like_prose(s: str) -> bool:
    """Two words in a row outside LaTeX commands and ``\\text{}``: a sentence, not an answer."""
    bare = re.sub(r"\\[a-zA-Z]+(?:\{[^{}]*\})?", " ", s)
    return "\n" in s.strip() or re.search(r"[A-Za-z]{2,}\s+[A-Za-z]{2,}", bare) is not None


# "Answer \\[ 9 \\]", "Final answer:\n$$\n9\n$$", "The answer is \\( 9 \\)": math after the cue, across lines
_CUED_DISPLAY_RE = re.compile(
    r"\banswer\s*(?:is\s*)?:?\s*(?:\$\$(.+?)\$\$|\\\[(.+?)\\\]|\\\((.+?)\\\))", re.IGNORECASE | re.DOTALL
)


def _last(matches: Iterator[re.Match]) -> re.Match | None:
    last = deque(matches, maxlen=1)
    return last[0] if last else None


def _cued_display(text: str) -> str | None:
    """The math span right after the last "answer" cue, when that span is all the cue says."""
    if (found := _last(_CUED_DISPLAY_RE.finditer(text[-2000:]))) is None:
        return None
    inner = _span_text(found).strip()
    return inner if 0 < len(inner) <= _MAX_FALLBACK_CHARS else None


def _final_answer_phrase(text: str, depth: int = 0) -> str | None:
    if (last := _last(_FINAL_RE.finditer(text[-2000:]))) is None:
        return None
    found = strip_delimiters(last.group(1).strip().rstrip("."))
    if not 0 < len(found) <= _MAX_FALLBACK_CHARS:
        return None
    if depth == 0 and _looks_like_prose(found) and last_boxed(found) is None:
        # "Final Answer: The final answer is $42$" / "Final Answer: The largest $n$ is 34."
        return _final_answer_phrase(found, 1) or _stated_result(found)
    return found


def _final_answer(text: str) -> str | None:
    """What "the final answer is …" states, its box's content if it has one."""
    if (phrase := _final_answer_phrase(text)) is None:
        return None
    inner = last_boxed(phrase)
    return inner if inner is not None else phrase


def _bare_final_number(text: str) -> str | None:
    """The last number, with up to three words after it ("42 stickers left", "12 dozen eggs"):
    units are dropped when comparing, words that change the value ("6 squared") are not."""
    tail = text[-500:].strip()
    if (found := _last(_NUMBER_RE.finditer(tail))) is None:
        return None
    words = _WORDS_AFTER_RE.match(tail, found.end())
    return (found.group(0).rstrip(",") + (words.group(0) if words else "")).strip()


def _short_answer(text: str) -> str | None:
    """The text itself when it reads as an answer ("x >= 3", "2 and 3", "12 cm", a matrix), not a sentence."""
    if len(text) > 4 * _MAX_FALLBACK_CHARS:  # a long text is no short answer (and not worth a scan)
        return None
    short = strip_delimiters(_unbold(text).strip())
    if _MATH_DOLLAR_RE.search(short) or _LEAD_WORD_RE.match(short):  # "So, $x=5$.", "Thus: 7"
        return None  # a sentence after all
    if short and len(short) <= _MAX_FALLBACK_CHARS and not _looks_like_prose(short):
        return short.rstrip(".").strip() or None
    return None


def _last_sentence(text: str) -> str:
    """The last sentence that states something (a digit, a math span, a LaTeX command), else the last."""
    tail = _unbold(text[-2000:])
    parts = [p.strip() for p in _SENTENCE_END_RE.split(tail)]
    for part in reversed(parts):
        if part and re.search(r"[\d$\\]", part):
            return part
    return next((part for part in reversed(parts) if part), "")  # a word answer, if any


def _span_text(m: re.Match) -> str:
    return next(g for g in m.groups() if g is not None)


def _stated_result(sentence: str) -> str | None:
    """From the last sentence: what follows its last cue word outside math ("is", "are", "=",
    "equals", ":"), math spans unwrapped, cut where the prose goes on ("the roots are $x = 2$ and
    $x = 3$" → "x = 2 and x = 3"); else its last math span."""
    spans = list(_SPAN_RE.finditer(sentence))
    cues = [c for c in _CUE_RE.finditer(sentence) if not any(m.start() <= c.start() < m.end() for m in spans)]
    results = [_result_after(sentence[c.end() :]) for c in reversed(cues)]
    for result in results:  # the last cue stating something mathematical ("is 100 square units,
        if result and _MATHS_RE.search(result):  # reached when the sides are equal": not "equal")
            return result
    if results and results[0]:  # a word answer ("The winner is Evelyn.")
        return results[0]
    return _span_text(spans[-1]).strip() or None if spans else None


def _result_after(text: str) -> str | None:
    rest = _SPAN_RE.sub(_span_text, _FILLER_RE.sub("", text))
    end = _RESULT_END_RE.search(rest)
    result = (rest[: end.start()] if end else rest).strip().rstrip(".").strip()
    if not result or len(result) > _MAX_FALLBACK_CHARS:
        return None
    return result if not _looks_like_prose(result) or _VALUE_WITH_UNIT_RE.fullmatch(result) else None


def _from_answer_block(scope: str) -> str | None:
    # a short answer: <answer>33</answer> or <answer>$\\frac{1}{2}$</answer>
    finds = (last_boxes, _short_answer, _final_answer, _bare_final_number)
    return next((found for find in finds if (found := find(scope)) is not None), None)


def _lenient_scope(text: str) -> str | None:
    tail = _unbold(text[-4000:])
    steps = ((last_boxes, text), (_cued_display, tail), (_final_answer, tail), (_short_answer, text))
    for find, scope in steps:
        if (found := find(scope)) is not None:
            return found
    sentence = _last_sentence(text)
    stated = _stated_result(sentence) if sentence else None
    return stated if stated is not None else _bare_final_number(sentence or text)


def extract_answer(response: str, mode: Mode = DEFAULT_ROLLOUT.verify_mode) -> str | None:
    """The final answer as written by the model, or None when there is none to grade. ``strict``:
    only the last ``<answer>…</answer>`` block counts (a response cut before ``</answer>`` has no
    answer). ``lenient``: that block if there is one, else, in order, the last box anywhere, "final
    answer is …", the response itself when it is short, the result the last sentence states, its last number."""
    if mode not in ("strict", "lenient"):
        raise ValueError(f"mode must be 'strict' or 'lenient', not {mode!r}")
    response = cut_next_turn(response)
    block = answer_block(response)
    found = _from_answer_block(block) if block is not None else None
    if found is not None or mode == "strict":
        return found
    return _lenient_scope(response)
