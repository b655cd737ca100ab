"""The written map stays true: ARCHITECTURE.md names every module, and every import between the
package's rooms goes the way its table says (downward; the ground floor imports only itself)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "rstar2"
MAP = (ROOT / "ARCHITECTURE.md").read_text()
GROUND = {"config", "device", "problems", "jsonl", "memory", "importer"}


def _rooms() -> dict[str, set[str]]:
    """The folder table: each room and the rooms it may import (read from the map itself)."""
    table = MAP.split("| folder | what it owns | imports |", 1)[1].split("\n\n", 1)[0]
    rooms: dict[str, set[str]] = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        room = cells[0].strip("`/")
        if "all of the above" in cells[2]:
            rooms[room] = set(rooms)
        else:
            rooms[room] = set(re.findall(r"`(\w+)`", cells[2]))
    rooms["recipe"] |= {"importer"}
    return rooms


def _imports(path: Path) -> set[str]:
    """The top-level parts of rstar2 a module imports (relative imports resolved)."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(parts[: len(parts) - node.level])
            names = (node.module or "").split(".") if node.module else [node.names[0].name]
            target = [*base, *[n for n in names if n]]
            out.add(target[0] if target else names[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rstar2."):
            out.add(node.module.split(".")[1])
    return out


def test_every_module_is_on_the_map():
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        rel = path.relative_to(PACKAGE).as_posix()
        if f"`{rel}`" not in MAP and f"`{path.name}`" not in MAP:
            missing.append(rel)
    assert not missing, f"modules ARCHITECTURE.md does not name: {missing}"


def test_imports_between_rooms_go_the_way_the_map_says():
    rooms = _rooms()
    assert set(rooms) >= {"sandbox", "chat", "reward", "engines", "rollout", "rl", "recipe"}
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        here = parts[0] if len(parts) > 1 else parts[0]
        for target in _imports(path) - {here}:
            if here in GROUND:
                ok = target in GROUND
            elif here in rooms:
                ok = target in rooms[here] or (target in GROUND and here != "sandbox")
            else:  # cli.py and the package's own entry points sit on top
                ok = True
            if not ok:
                wrong.append(f"{path.relative_to(PACKAGE)} imports {target}")
    assert not wrong, "imports against the map:\n" + "\n".join(wrong)
