"""Which zygote a call fits: the light one (standard library only) when everything its code imports
is already imported there, else the full one (numpy, sympy, …). Forking the smaller process is cheaper.
"""

from __future__ import annotations

import re
import sys

_IMPORT = re.compile(r"(?:^|[;:])[ \t]*(?:from[ \t]+([\w.]+)[ \t]+import\b|import[ \t]+([\w. \t,]+))", re.M)


def imported_modules(code: str) -> set[str] | None:
    """Top-level names of the modules `code` imports by statement; None if it imports dynamically.
    A textual scan (the code is never parsed here, outside the sandbox): an import it misses only
    sends the call to the light zygote, where the import still works, just slower."""
    if "__import__" in code or "importlib" in code:
        return None
    names: set[str] = set()
    for match in _IMPORT.finditer(code):
        if match.group(1) is not None:
            names.add(match.group(1).partition(".")[0])
            continue
        for part in match.group(2).split(","):
            words = part.split()
            if words:
                names.add(words[0].partition(".")[0])
    return names


def fits_light(code: str, light_modules: frozenset[str]) -> bool:
    """Whether everything `code` imports is already imported in the light zygote."""
    names = imported_modules(code)
    return names is not None and names <= light_modules


def split_preload(modules: list[str]) -> tuple[list[str], list[str]]:
    """(light, full) preload lists: the light zygote takes the standard-library part."""
    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    light = [m for m in modules if m.partition(".")[0] in stdlib]
    return light, list(modules)
