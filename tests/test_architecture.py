"""The written map stays true: ARCHITECTURE.md names every module, and every import between the
package's rooms goes the way its table says (downward; the ground floor imports only itself), and
no module imports itself through others."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "rstar2"
MAP = (ROOT / "ARCHITECTURE.md").read_text()
GROUND = {
    "config",
    "device",
    "problems",
    "gym",
    "jsonl",
    "memory",
    "importer",
    "local_service",
    "plots",
    "auth",
}


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


def _module_imports() -> dict[tuple[str, ...], set[tuple[str, ...]]]:
    """Each module of the package (as its dotted parts) and the package's modules it imports,
    imports inside functions included: a lazy import still ties the two modules together."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        modules[parts[:-1] if parts[-1] == "__init__" else parts] = path
    graph: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    for name, path in modules.items():
        folder = path.relative_to(PACKAGE).parent.parts
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = folder[: len(folder) - node.level + 1]
            elif (node.module or "").startswith("rstar2"):
                base, node.module = (), node.module.removeprefix("rstar2").lstrip(".")
            else:
                continue
            module = (*base, *filter(None, (node.module or "").split(".")))
            for alias in node.names:  # `from . import distributed` names a module
                targets.add((*module, alias.name) if (*module, alias.name) in modules else module)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def test_no_module_imports_itself_through_others():
    """No circle of imports anywhere in the package, inside a folder included (there a circle is
    a sign that one module holds two concepts: the trainers' dispatch sat in the module both
    trainers start from)."""
    graph = _module_imports()
    assert ("rl", "launch") in graph[("rl", "sft")]  # relative imports are read
    circles = []
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for target in graph[node]:
                if target == start:
                    circles.append(" -> ".join(".".join(m) for m in [*path, start]))
                elif target > start and target not in path:  # each circle found once, from its least module
                    stack.append((target, [*path, target]))
    assert not circles, "import circles:\n" + "\n".join(circles)
