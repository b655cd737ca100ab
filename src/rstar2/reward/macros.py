"""Which text macros and unknown macros in an answer are mathematics, which decoration. A grader that
deletes ``\\text{…}``, ``\\mathrm{…}`` and unknown macros pays the policy for ``42 + \\text{anything}`` or
``42\\sqrt(17)`` against ``42``, and reads ``1 - \\frac{1}{\\mathrm{e}}`` as ``1 + \\frac{1}{\\mathrm{e}}``.
The rule, applied before any CAS sees the answer:

- a text or font macro holding mathematics (``\\mathrm{e}``, ``\\text{x}``) is that mathematics;
- ``\\operatorname{sin}`` is ``\\sin`` when the CAS knows the function; any other name is kept;
- words between items (``\\text{ and }``, ``\\text{or}``) are the plain separators ``and`` / ``or``;
- words that are a unit or a label (``\\text{ cm}^2``) are dropped only at the end of a whole answer
  (not ending on an operator) and when they hold no digits, brackets or hedges;
- ``\\sqrt(17)`` is read as ``\\sqrt{17}``, what it plainly means;
- whatever else the CAS would drop or misread (a text macro, ``\\operatorname{f}``, an unknown
  ``\\foo``, ``\\frac(1)(2)``) is named by ``unreadable`` and the answer is refused."""

from __future__ import annotations

import re

_TEXTLIKE = (
    "text textnormal textrm textup textbf textit textsf texttt mbox hbox "
    "mathrm mathit mathbf mathsf mathtt mathnormal boldsymbol bm operatorname"
).split()
_TEXTLIKE_RE = re.compile(r"\\(" + "|".join(sorted(_TEXTLIKE, key=len, reverse=True)) + r")(?![A-Za-z])\s*\{")
# functions the CAS reads by name, so \operatorname{name} may become \name
FUNCTIONS = frozenset(
    "sin cos tan csc sec cot arcsin arccos arctan arccsc arcsec arccot sinh cosh tanh "
    "arsinh arcosh artanh arcsinh arccosh arctanh log ln exp gcd lcm max min det floor ceil".split()
)
# macros an answer may hold that the CAS reads as written (the rest are refused, never dropped)
KNOWN = FUNCTIONS | frozenset(
    (
        "frac dfrac tfrac cfrac sqrt binom dbinom tbinom choose pi infty circ degree cdot times div "
        "pm mp ast le leq ge geq lt gt ne neq in notin cup cap setminus emptyset varnothing "
        "subset subseteq supset supseteq left right bigl bigr Bigl Bigr big Big middle "
        "begin end matrix pmatrix bmatrix Bmatrix vmatrix array boxed fbox quad qquad displaystyle "
        "lfloor rfloor lceil rceil vert lvert rvert Vert lVert rVert mid langle rangle lbrace rbrace "
        "prime dots ldots cdots mod bmod pmod equiv approx sim simeq to rightarrow "
        "overline sum prod int lim mathbb R Z N Q C "
        "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi "
        "vec hat bar tilde overrightarrow widehat "
        "omicron rho varrho sigma varsigma tau upsilon phi varphi chi psi omega "
        "Gamma Delta Theta Lambda Xi Pi Sigma Upsilon Phi Psi Omega"
    ).split()
)
_MACRO_RE = re.compile(r"\\([A-Za-z]+)")
# words that make an answer a hedge, never a unit or a label
HEDGE_WORDS = frozenset(
    "or maybe perhaps possibly probably either approximately roughly about around nearly almost not".split()
)
_UNIT_WORDS_RE = re.compile(r"\s*[A-Za-z][A-Za-z .'/\-]*")
_POWER_AFTER_RE = re.compile(r"\s*\^\s*(?:\{\s*[23]\s*\}|[23])")
_SEPARATOR_WORDS = {"and": " and ", "or": " or ", ",": ", ", ";": "; "}
# an answer that ends here is not whole: something was cut off after an operator
_DANGLING_RE = re.compile(
    r"(?:[-+*/^_=,(\[{<>]|\\(?:cdot|times|div|pm|mp|frac|sqrt|le|ge|leq|geq|neq|in))\s*$"
)
_MALFORMED_SQRT_RE = re.compile(r"\\sqrt\s*\(")
_MALFORMED_RE = re.compile(r"\\(frac|dfrac|tfrac|binom|sqrt|text|mathrm|operatorname)\s*\(")


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


def _matching_paren(s: str, open_at: int) -> int | None:
    depth = 0
    for i in range(open_at, len(s)):
        if s[i] == "(":
            depth += 1
        elif s[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return None


def read_malformed(s: str) -> str:
    """``\\sqrt(17)`` → ``\\sqrt{17}``: what a malformed square root plainly means."""
    while (m := _MALFORMED_SQRT_RE.search(s)) is not None:
        if (close := _matching_paren(s, m.end() - 1)) is None:
            return s  # left as it is: ``unreadable`` names it
        s = f"{s[: m.start()]}\\sqrt{{{s[m.end() : close]}}}{s[close + 1 :]}"
    return s


def _words(content: str) -> list[str]:
    return re.findall(r"[A-Za-z]{2,}", content)


def _is_mathematics(content: str) -> bool:
    """No word of two letters or more outside macros: ``e``, ``x``, ``0``, ``\\pi``, ``v_1``."""
    return not _words(re.sub(r"\\[A-Za-z]+", " ", content))


def resolve(s: str) -> str:
    """Apply the rule above to every text-like macro of ``s``, left to right; macros the rule
    cannot resolve stay as they are (``unreadable`` then names them)."""
    if "\\" not in s:
        return s
    s = read_malformed(s.strip())
    pairs = matching_braces(s)
    out: list[str] = []
    pos = 0
    while (m := _TEXTLIKE_RE.search(s, pos)) is not None:
        if (close := pairs.get(m.end() - 1)) is None:
            break
        out.append(s[pos : m.start()])
        macro, content = m.group(1), s[m.end() : close]
        inner = " ".join(content.split())
        pos = close + 1
        if m.start() == 0 and close == len(s) - 1 and _words(inner):
            out.append(s)  # the whole answer is text ("\text{Evelyn}"): a word answer, kept
            continue
        if not inner:
            continue
        if macro == "operatorname":
            out.append(f"\\{inner} " if inner in FUNCTIONS else s[m.start() : pos])
            continue
        if inner.lower() in _SEPARATOR_WORDS:
            out.append(_SEPARATOR_WORDS[inner.lower()])
            continue
        if _is_mathematics(inner):  # a font change: its content, spaced only where letters would merge
            before_char, after_char = s[m.start() - 1 : m.start()], s[pos : pos + 1]
            if before_char in ("^", "_"):
                out.append(f"{{{inner}}}")
            else:
                out.append(
                    f"{' ' if before_char.isalnum() else ''}{inner}{' ' if after_char.isalnum() else ''}"
                )
            continue
        rest = s[pos:]
        power = _POWER_AFTER_RE.match(rest)
        after = rest[power.end() :] if power else rest
        before = "".join(out).rstrip()
        unit = (
            _UNIT_WORDS_RE.fullmatch(content) is not None
            and not {w.lower() for w in _words(inner)} & HEDGE_WORDS
            and not after.strip()
            and before
            and _DANGLING_RE.search(before) is None
        )
        if unit:  # a unit or label at the end of a whole answer: dropped, with its ^2
            pos = len(s)
            continue
        out.append(s[m.start() : pos])
    out.append(s[pos:])
    return "".join(out).strip()


def unreadable(s: str) -> str | None:
    """Why the CAS cannot be trusted with ``s`` as written (a text macro, an unknown operator name or
    macro, a macro with parentheses for braces); None when every macro is one it reads."""
    if malformed := _MALFORMED_RE.search(s):
        return f"a malformed \\{malformed.group(1)}(...)"
    if text := _TEXTLIKE_RE.search(s):
        return f"text inside the mathematics (\\{text.group(1)}{{...}})"
    for name in _MACRO_RE.findall(s):
        if name not in KNOWN:
            return f"an unknown macro \\{name}"
    return None


def hedges(answer: str, reference: str) -> set[str]:
    """Hedge words (``or``, ``maybe``…) of the answer, text macros included, that the reference lacks."""

    def words(s: str) -> set[str]:
        return {w.lower() for w in re.findall(r"(?<![\\A-Za-z])[A-Za-z]+", s)} & HEDGE_WORDS

    return words(answer) - words(reference)
