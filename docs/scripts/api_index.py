"""An MkDocs hook that writes the API index at build time.

`docs/api/index.md` holds the marker `<!-- api-index -->`; this hook replaces it
with one table per public namespace (`filterax`, then each public subpackage
such as `filterax.nn`), one row per public name: the name, linked to its entry
in the API reference, and the first line of its docstring. The names come from
the package itself, so the index cannot go stale; a public name that no page
under `docs/api/` documents (`::: filterax.name`) is a warning, which fails
`mkdocs build --strict`.

Loaded from `mkdocs.yml` (`hooks:`).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
import types
from pathlib import Path
from typing import Any

MARKER = "<!-- api-index -->"
PAGE = "api/index.md"
ROOT_PACKAGE = "filterax"
# Public subpackages that `import filterax` does not import, because each needs
# an optional extra (orbax, safetensors): imported here by name.
OPTIONAL_SUBPACKAGES = ("checkpoint", "safetensors")

_logger = logging.getLogger("mkdocs.hooks.api_index")


def public_names(module: types.ModuleType) -> list[str]:
    """The public names a namespace defines or re-exports from filterax (the
    same rule `tests/test_docs.py` uses), sorted case-insensitively."""
    return sorted(
        (
            name
            for name, value in vars(module).items()
            if not name.startswith("_")
            and getattr(value, "__module__", "").startswith(ROOT_PACKAGE)
            and not isinstance(value, types.ModuleType)
        ),
        key=str.lower,
    )


def namespaces() -> list[types.ModuleType]:
    """`filterax` and each public subpackage: those it exposes (`filterax.nn`,
    ...) and the optional ones (`filterax.checkpoint`, ...), sorted by name."""
    root = importlib.import_module(ROOT_PACKAGE)
    found = {}
    for name, value in vars(root).items():
        if (
            isinstance(value, types.ModuleType)
            and not name.startswith("_")
            and value.__name__ == f"{ROOT_PACKAGE}.{name}"
        ):
            found[name] = value
    for name in OPTIONAL_SUBPACKAGES:
        try:
            found[name] = importlib.import_module(f"{ROOT_PACKAGE}.{name}")
        except ModuleNotFoundError as error:  # its extra is not installed
            _logger.warning(
                "%s.%s is not in the API index: %s", ROOT_PACKAGE, name, error
            )
    return [root] + [found[name] for name in sorted(found)]


def summary(value: Any) -> str:
    """The first line of a docstring, on one line; empty when there is none."""
    doc = inspect.getdoc(value) or ""
    first = doc.split("\n\n", 1)[0]
    return " ".join(first.split()).replace("|", r"\|")


def documented(api_dir: Path) -> dict[str, str]:
    """Each `::: dotted.name` entry under `api_dir`, mapped to its page."""
    entry = re.compile(r"^:::\s+([\w.]+)\s*$", re.M)
    pages = {}
    for page in sorted(api_dir.glob("*.md")):
        for name in entry.findall(page.read_text(encoding="utf-8")):
            pages[name] = page.name
    return pages


def index_markdown(api_dir: Path) -> str:
    """The tables that replace the marker."""
    entries = documented(api_dir)
    sections = []
    for module in namespaces():
        rows = []
        for name in public_names(module):
            path = f"{module.__name__}.{name}"
            if path not in entries:
                _logger.warning(
                    "%s is public but no page under docs/api/ documents it "
                    "(add `::: %s`)",
                    path,
                    path,
                )
                continue
            rows.append(f"| [`{name}`][{path}] | {summary(getattr(module, name))} |")
        if rows:
            sections.append(
                f"## `{module.__name__}`\n\n| name | summary |\n|---|---|\n"
                + "\n".join(rows)
            )
    return "\n\n".join(sections)


def on_page_markdown(markdown: str, page: Any, config: Any, **kwargs: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        _logger.warning("%s has no %s marker", PAGE, MARKER)
        return markdown
    api_dir = Path(config["docs_dir"]) / "api"
    return markdown.replace(MARKER, index_markdown(api_dir))
