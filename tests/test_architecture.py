"""The package's shape: its import graph has no circle (not even through the
imports inside functions), imports sit at the top of modules, and every folder
says what it holds and what it may import.

The graph is read from the source with `ast` (nothing is imported): an edge
`a -> b` for every module-level `import`/`from ... import` inside `filterax`,
where importing a name from a package (`from .._module import Module`) counts
as importing the package, which imports its own modules.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "filterax"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(importer: str, node: ast.ImportFrom) -> list[str]:
    """The filterax modules a `from ... import ...` statement imports."""
    if node.level == 0:
        base = node.module or ""
        if not base.startswith("filterax"):
            return []
    else:
        anchor = importer.split(".")
        if not _is_package(importer):
            anchor = anchor[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, *([node.module] if node.module else [])])
    targets = []
    for alias in node.names:
        candidate = f"{base}.{alias.name}"
        targets.append(candidate if candidate in MODULES else base)
    return [target for target in targets if target in MODULES]


def _top_level_imports(name: str) -> list[str]:
    tree = ast.parse(MODULES[name].read_text())
    found = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            found += _resolve(name, node)
        elif isinstance(node, ast.If):  # `if TYPE_CHECKING:` blocks
            continue
    return found


def _graph() -> dict[str, set[str]]:
    return {name: set(_top_level_imports(name)) for name in MODULES}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if target == node:
                continue
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_import_graph_has_no_circle():
    cycle = _find_cycle(_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def _every_import(name: str) -> list[str]:
    """The filterax modules `name` imports anywhere: at the top, inside
    functions (the deferred imports of optional extras) and under
    `if TYPE_CHECKING:`."""
    tree = ast.parse(MODULES[name].read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found += _resolve(name, node)
    return found


def test_no_circle_even_through_imports_inside_functions():
    # A deferred import breaks a circle at run time but not in the design: a
    # low module that reaches up for a higher one when called (as the display
    # hooks once reached for a treescope module that imported the package).
    cycle = _find_cycle({name: set(_every_import(name)) for name in MODULES})
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_a_circle_would_be_found():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def _nested_imports(path: Path) -> list[tuple[int, str]]:
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                line = lines[node.lineno - 1]
                before = lines[node.lineno - 2] if node.lineno > 1 else ""
                if "#" not in line and not before.strip().startswith("#"):
                    found.append((node.lineno, line.strip()))
    return found


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_inside_functions_say_why(name):
    assert _nested_imports(MODULES[name]) == []


@pytest.mark.parametrize(
    "name", sorted(name for name in MODULES if _is_package(name) and name != "filterax")
)
def test_every_folder_says_what_it_holds_and_may_import(name):
    docstring = ast.get_docstring(ast.parse(MODULES[name].read_text())) or ""
    assert docstring, f"{name} has no docstring"
    if name.startswith("filterax._"):
        assert "May import" in docstring, f"{name} does not say what it may import"


def _folder_of(module: str) -> str | None:
    """The part of `filterax` a module belongs to: `_module` for
    `filterax._module._field`, `_tree` for `filterax._tree._utilities`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _declared_imports(package: str) -> set[str]:
    """The parts of filterax named (in backticks) in the package docstring's
    "May import:" paragraph."""
    docstring = ast.get_docstring(ast.parse(MODULES[package].read_text())) or ""
    paragraph = docstring[docstring.index("May import") :].split("\n\n")[0]
    parts = {_folder_of(name) for name in MODULES}
    named = {word.lstrip(".") for word in re.findall(r"`([\w.]+)`", paragraph)}
    return {name.split(".")[0] for name in named} & parts


def _real_imports(package: str) -> set[str]:
    """The other parts of filterax that the package's modules import, at the
    top or inside functions."""
    own = _folder_of(package)
    found = set()
    for name in MODULES:
        if name == package or name.startswith(package + "."):
            found |= {_folder_of(target) for target in _every_import(name)}
    return found - {own, None}


@pytest.mark.parametrize(
    "name", sorted(name for name in MODULES if _is_package(name) and name != "filterax")
)
def test_each_may_import_list_is_the_real_one(name):
    declared, real = _declared_imports(name), _real_imports(name)
    assert sorted(real - declared) == [], f"{name} imports what its list omits"
    assert sorted(declared - real) == [], f"{name} lists what it does not import"
