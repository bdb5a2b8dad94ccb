"""Checks that the built API pages show only public names in signatures.

Reads every page of a built site (`mkdocs build --site-dir DIR`), takes the
text of each rendered signature (mkdocstrings' `doc-signature` blocks), parses
it as a Python parameter list, and reports every name used in a default value
that a user could not write: a private name (`_identity`, `x._y`) or a bare
name that is neither a builtin nor public in `filterax`, `filterax.nn`,
`filterax.debug` or `filterax.checkpoint` (such as `DEFAULT_AXES`). A
signature that does not parse is reported too (Ruff cannot format it either).

    python docs/scripts/check_signatures.py SITE_DIR

Exits with status 1, listing each problem as `page: signature: problem`, or
when the site holds no signature at all (so the check cannot pass vacuously).
Fix a report by listing the default's meaning in
`docs/scripts/griffe_public_defaults.py`.
"""

from __future__ import annotations

import ast
import builtins
import html.parser
import importlib
import re
import sys
from collections.abc import Iterable
from pathlib import Path

# Namespaces whose public names a default may use unqualified.
NAMESPACES = ("filterax", "filterax.nn", "filterax.debug", "filterax.checkpoint")
# Modules a default may name by their usual alias (`jax.nn.relu`, `jnp.float32`).
MODULE_ALIASES = {"jax", "jnp", "np", "numpy", "math", "filterax", "fx"}


class _SignatureText(html.parser.HTMLParser):
    """Collects the text of each `<div class="doc-signature ...">` block."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.signatures: list[str] = []
        self._parts: list[str] | None = None
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag != "div":
            return
        if self._parts is not None:
            self._depth += 1
        elif "doc-signature" in (dict(attrs).get("class") or "").split():
            self._parts, self._depth = [], 1

    def handle_endtag(self, tag: str) -> None:
        if tag != "div" or self._parts is None:
            return
        self._depth -= 1
        if self._depth == 0:
            self.signatures.append("".join(self._parts).strip())
            self._parts = None

    def handle_data(self, data: str) -> None:
        if self._parts is not None:
            self._parts.append(data)


def signatures(page_html: str) -> list[str]:
    """The text of every rendered signature in one HTML page."""
    parser = _SignatureText()
    parser.feed(page_html)
    parser.close()
    return parser.signatures


def public_names() -> frozenset[str]:
    """The names a default may use unqualified: builtins, the public names of
    filterax's namespaces, and the usual module aliases."""
    names = set(dir(builtins)) | MODULE_ALIASES
    for namespace in NAMESPACES:
        try:
            module = importlib.import_module(namespace)
        except ImportError:  # a namespace this version does not have
            continue
        names |= {name for name in vars(module) if not name.startswith("_")}
    return frozenset(names)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _names_in(expression: ast.expr) -> Iterable[tuple[str, set[str]]]:
    """Every name and attribute in an expression, with the lambda parameters
    in scope where it occurs."""
    bound: dict[ast.AST, set[str]] = {}
    for node in ast.walk(expression):
        scope = bound.get(node, set())
        if isinstance(node, ast.Lambda):
            arguments = node.args
            scope = scope | {
                a.arg
                for a in [
                    *arguments.posonlyargs,
                    *arguments.args,
                    *arguments.kwonlyargs,
                ]
            }
            scope |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a}
        for child in ast.iter_child_nodes(node):
            bound[child] = scope
        if isinstance(node, ast.Name):
            yield node.id, scope
        elif isinstance(node, ast.Attribute):
            yield node.attr, {node.attr}  # an attribute needs only be public


def problems(signature: str, allowed: frozenset[str]) -> list[str]:
    """What is wrong with one rendered signature, of a callable
    (`Name(x, f=_g)`) or of an attribute (`name`, `Alias = Target`): an empty
    list when its default values use only names a user could write."""
    match = re.match(r"\s*[\w.]+\s*(?=\()", signature)
    if match is None:  # an attribute: `name`, `name = value`, `name: type = value`
        try:
            statement = ast.parse(signature.strip()).body[0]
        except (SyntaxError, IndexError):
            return [f"not a signature: {signature!r}"]
        value = getattr(statement, "value", None)
        if not isinstance(statement, (ast.Expr, ast.Assign, ast.AnnAssign)):
            return [f"not a signature: {signature!r}"]
        if isinstance(statement, ast.Expr) or value is None:
            return []
        return _default_problems([value], allowed)
    source = f"def f{signature[match.end() :]}: pass"
    try:
        function = ast.parse(source).body[0]
    except SyntaxError as error:
        return [f"does not parse as Python ({error.msg})"]
    assert isinstance(function, ast.FunctionDef)
    arguments = function.args
    found = []
    for parameter in [
        *arguments.posonlyargs,
        *arguments.args,
        *arguments.kwonlyargs,
        *(a for a in (arguments.vararg, arguments.kwarg) if a),
    ]:
        if _is_private(parameter.arg):
            found.append(f"private parameter name {parameter.arg!r}")
    defaults = [*arguments.defaults, *arguments.kw_defaults]
    return found + _default_problems([d for d in defaults if d is not None], allowed)


def _default_problems(defaults: list[ast.expr], allowed: frozenset[str]) -> list[str]:
    found = []
    for default in defaults:
        for name, scope in _names_in(default):
            if _is_private(name):
                found.append(f"private name {name!r} in a default")
            elif name not in allowed and name not in scope:
                found.append(f"{name!r} in a default is not a public name")
    return found


def check_site(site: Path, allowed: frozenset[str]) -> tuple[int, list[str]]:
    """The number of signatures in the built site and the problems found."""
    count, found = 0, []
    for page in sorted(site.rglob("*.html")):
        for signature in signatures(page.read_text(encoding="utf-8")):
            count += 1
            one_line = " ".join(signature.split())
            found += [
                f"{page.relative_to(site)}: {one_line}: {problem}"
                for problem in problems(signature, allowed)
            ]
    return count, found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    site = Path(argv[0])
    count, found = check_site(site, public_names())
    if count == 0:
        print(f"check_signatures: no signature found under {site}", file=sys.stderr)
        return 1
    for line in found:
        print(line, file=sys.stderr)
    print(f"check_signatures: {count} signatures, {len(found)} problems")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
