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
    "config_files",
    "adapters",
    "device",
    "problems",
    "gym",
    "jsonl",
    "memory",
    "importer",
    "local_service",
    "plots",
    "auth",
    "weight_transfer",
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


def _mapped_files() -> list[str]:
    """The files the map's file-by-file tables name, as paths in the package: a row's file is
    relative to the one folder its section is about (none: the ground floor, or named in full)."""
    rooms = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    named, room = [], ""
    for line in MAP.split("## File by file", 1)[1].splitlines():
        if line.startswith("### "):
            heading = re.findall(r"`(\w+)/`", line)
            room = heading[0] + "/" if len(heading) == 1 else ""
        elif line.startswith("| `"):
            for name in re.findall(r"`([\w/]+\.py)`", line.split("|")[1]):
                named.append(name if name.split("/")[0] in rooms else room + name)
    return named


def test_every_module_is_on_the_map_once():
    """One line a file, under its own folder's heading, and no line for a file that is not there."""
    named = _mapped_files()
    files = {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    }
    assert not files - set(named), f"modules ARCHITECTURE.md does not name: {sorted(files - set(named))}"
    assert not set(named) - files, f"the map names files that are not there: {sorted(set(named) - files)}"
    assert len(named) == len(set(named)), "a file named twice"


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
    assert ("rl", "run", "launch") in graph[("rl", "sft")]  # relative imports are read
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


def test_the_algorithm_stands_apart_from_the_run_machinery():
    """``rl/algorithm/`` (advantages, RoC, the loss, batches, the staleness rules) imports nothing
    of the rest of ``rl/``: it reads and tests without processes, engines or files."""
    graph = _module_imports()
    algorithm = [m for m in graph if m[:2] == ("rl", "algorithm")]
    assert len(algorithm) >= 5
    wrong = [
        f"{'.'.join(m)} imports {'.'.join(t)}"
        for m in algorithm
        for t in graph[m]
        if t[0] == "rl" and t[:2] != ("rl", "algorithm")
    ]
    assert not wrong, "\n".join(wrong)


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string constants that are docstrings or bare expression statements."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }


def test_the_format_tags_are_spelled_only_in_their_home():
    """``<answer>``, ``<tool_call>``, … are ``chat/tags.py``'s: any other module takes them from
    there (``chat/prompt.py`` spells them in the prose the model reads); docstrings and help texts
    may name them."""
    from rstar2.chat import tags

    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in ("chat/tags.py", "chat/prompt.py"):
            continue
        tree = ast.parse(path.read_text())
        skip = _docstrings(tree)
        skip |= {id(k.value) for k in ast.walk(tree) if isinstance(k, ast.keyword) and k.arg == "help"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                hits = [t for t in tags.ALL if t in node.value]
                if hits:
                    found.append(f"{rel}:{node.lineno} spells {hits[0]}: import it from chat/tags.py")
    assert not found, "\n".join(found)


# values that mean "nothing chosen" or "no change" wherever they appear (resolve later, T = 1, off),
# and names another concept shares with a setting (``enabled`` of a log, of the isolation layers)
NEUTRAL = {
    ("device", "auto"),
    ("dtype", "auto"),
    ("compute", "auto"),
    ("progress", True),
}
OTHER_CONCEPTS = {"enabled"}
ALIASES = {"mode": "verify_mode", "window": "reflection_window", "floor": "min_lr_ratio", "eps": "adv_eps"}


def _setting_defaults() -> dict[str, set]:
    """Each setting of config.py's sections (by its key) and the defaults it has there."""
    from pydantic import BaseModel

    from rstar2 import config

    homes: dict[str, set] = {}
    for obj in vars(config).values():
        if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__ == config.__name__:
            for key, field in obj.model_fields.items():
                if isinstance(field.default, (bool, int, float, str)):
                    homes.setdefault(key, set()).add((type(field.default), field.default))
    return homes


def _written_defaults(tree: ast.AST):
    """(name, default node) of every parameter and class field with a default in a module."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            positional = a.posonlyargs + a.args
            with_default = positional[len(positional) - len(a.defaults) :]
            pairs = [
                *zip(with_default, a.defaults, strict=True),
                *zip(a.kwonlyargs, a.kw_defaults, strict=True),
            ]
            for x, d in pairs:
                if isinstance(d, ast.Call) and getattr(d.func, "attr", "") == "Option" and d.args:
                    d = d.args[0]  # a command's option: typer.Option(DEFAULT, ...)
                if d is not None:
                    yield x.arg, d
        elif isinstance(node, ast.ClassDef):
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None:
                    value = st.value
                    if (
                        isinstance(value, ast.Call)
                        and getattr(value.func, "id", "") == "Field"
                        and value.args
                    ):
                        value = value.args[0]
                    yield st.target.id, value


def test_every_default_has_one_home():
    """A setting's default is written in config.py only: a parameter or field elsewhere that takes
    the same setting refers to it (``DEFAULT_LOSS.adv_eps``, ``DEFAULT_CHAT.stateful``) or is
    required, never restates the number; the recipe adds no second name for a section's key."""
    from rstar2.config import ModelSection, RLConfig, SFTConfig
    from rstar2.recipe.spec import SECTIONS, ModelSpec, Recipe, StageSpec

    homes = _setting_defaults()
    restated = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "config.py":
            continue
        for name, node in _written_defaults(ast.parse(path.read_text())):
            if not isinstance(node, ast.Constant) or name in OTHER_CONCEPTS or (name, node.value) in NEUTRAL:
                continue
            settings = homes.get(ALIASES.get(name, name), set()) | homes.get(name, set())
            if (type(node.value), node.value) in settings:
                restated.append(f"{rel}:{node.lineno} {name}={node.value!r}: use config's default")
    assert not restated, "\n".join(restated)
    # the recipe: sections by their own names, nothing beside them that a section already has
    sections = set(RLConfig.model_fields) | set(SFTConfig.model_fields)
    assert set(SECTIONS) <= sections
    assert set(StageSpec.model_fields) == {"name", "kind", "data", "filter", "ladder", *SECTIONS}
    # (cluster: the same section, where the whole recipe runs; no stage has one of its own)
    assert not set(Recipe.model_fields) & (sections - {"model", "rollout", "cluster"})
    assert Recipe.model_fields["cluster"].annotation == RLConfig.model_fields["cluster"].annotation
    assert issubclass(ModelSpec, ModelSection)  # the recipe's model: is the config's, plus its source


# the sandbox's parameters by the home they take their default from (sandbox/defaults.py's names)
SANDBOX_ALIASES = {"idle_s": "session_idle_s", "max_sessions": "sessions_per_worker"}


def _sandbox_homes() -> dict[str, object]:
    """The sandbox's defaults by name: a call's limits (``Limits``'s fields) and its services'
    (``sandbox/defaults.py``)."""
    import dataclasses

    from rstar2.sandbox import defaults
    from rstar2.sandbox.request import Limits

    homes = {f.name: f.default for f in dataclasses.fields(Limits)}
    homes.update({k.lower(): v for k, v in vars(defaults).items() if k.isupper()})
    return homes


def _looked_up_defaults(tree: ast.AST):
    """(key, default node) of every ``x.get("key", default)``: a setting read with a fallback."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") == "get"
            and len(node.args) == 2
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value, node.args[1]


def test_every_sandbox_default_has_one_home():
    """The sandbox's defaults (a call's timeout and memory, the Redis deadline and lease, the port,
    the sessions' cap and idle time) are written once, in ``Limits`` or ``sandbox/defaults.py``
    (the sandbox reads nothing of config.py): a command's option, a parameter, a field or a lookup
    elsewhere in the package that takes one refers to it, never retypes the number."""
    homes = _sandbox_homes()
    assert {"timeout_s", "memory_mb", "deadline_s", "lease_s", "port", "session_idle_s"} <= set(homes)
    restated = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "sandbox/defaults.py":
            continue
        tree = ast.parse(path.read_text())
        if rel == "sandbox/request.py":  # Limits' own fields are the home of a call's limits
            tree.body = [n for n in tree.body if not (isinstance(n, ast.ClassDef) and n.name == "Limits")]
        for name, node in [*_written_defaults(tree), *_looked_up_defaults(tree)]:
            home = SANDBOX_ALIASES.get(name, name)
            if not isinstance(node, ast.Constant) or home not in homes or isinstance(node.value, bool):
                continue
            if node.value == homes[home]:
                restated.append(f"{rel}:{node.lineno} {name}={node.value!r}: use the sandbox's default")
    assert not restated, "\n".join(restated)
