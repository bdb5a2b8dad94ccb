"""Runs the Python code blocks of the documentation.

Every ```` ```python ```` fenced block in `docs/**/*.md` and `README.md` is
executed. The blocks of one page run in order, in one namespace, so a later
block may use what an earlier one defined; each page is one test, named after
its file. A block opts out with a `no-run` marker, either in its info string
(```` ```python {.no-run} ````) or as an HTML comment `<!-- no-run -->` on the
line before it; keep that for blocks that cannot run (shell sessions written as
Python, code that needs hardware or files outside the repository).

Pages run in a fresh temporary directory, so a block may write files with
relative paths. A page that imports an optional dependency (optax, matplotlib,
beartype) is skipped when it is not installed.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import re
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_NO_RUN_COMMENT = re.compile(r"^\s*<!--\s*no-run\s*-->\s*$")
_PYTHON_LANGUAGES = {"python", "py", "python3"}
# Pages that import these (from the `examples` and `test` extras) are skipped
# when they are missing, rather than failing.
OPTIONAL_MODULES = {
    "optax",
    "matplotlib",
    "beartype",
    "orbax",
    "safetensors",
    "diffrax",
    "optimistix",
    "lineax",
    "equinox",
}


@dataclasses.dataclass(frozen=True)
class CodeBlock:
    path: Path
    line: int  # 1-based line number of the first line of code
    code: str
    run: bool


def _language(info: str) -> str:
    """The language of a fence's info string: `python`, `{.python .x}`,
    `python {.no-run}` and `python title="x.py"` all give `python`."""
    info = info.strip()
    if info.startswith("{"):
        classes = re.findall(r"\.([\w-]+)", info)
        return classes[0].lower() if classes else ""
    return info.split(maxsplit=1)[0].lower() if info else ""


def code_blocks(path: Path) -> list[CodeBlock]:
    """The fenced code blocks of a Markdown file whose language is Python."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence, info = opening["indent"], opening["fence"], opening["info"]
        closing = re.compile(rf"^[ \t]*{fence[0]}{{{len(fence)},}}\s*$")
        end = index + 1
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        if _language(info) in _PYTHON_LANGUAGES:
            previous = next(
                (line for line in reversed(lines[:index]) if line.strip()), ""
            )
            no_run = "no-run" in info or bool(_NO_RUN_COMMENT.match(previous))
            body = [
                line[len(indent) :] if line.startswith(indent) else line.lstrip()
                for line in lines[index + 1 : end]
            ]
            code = textwrap.dedent("\n".join(body))
            blocks.append(CodeBlock(path, index + 2, code, run=not no_run))
        index = end + 1
    return blocks


def _pages() -> list[Path]:
    pages = sorted((ROOT / "docs").glob("**/*.md"))
    readme = ROOT / "README.md"
    if readme.exists():
        pages.append(readme)
    return [page for page in pages if code_blocks(page)]


def _page_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("page", _pages(), ids=_page_id)
def test_page_code_blocks_run(page: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    # A real module, so that classes defined in the blocks have a home in
    # `sys.modules` (dataclasses, typing and pickle look their module up).
    name = "docs_" + re.sub(r"\W", "_", _page_id(page))
    module = types.ModuleType(name)
    module.__file__ = str(page)
    monkeypatch.setitem(sys.modules, name, module)
    for block in code_blocks(page):
        if not block.run:
            continue
        # Leading newlines make tracebacks point at the right line of the page.
        source = "\n" * (block.line - 1) + block.code
        try:
            code = compile(source, str(page), "exec")
        except SyntaxError as error:
            pytest.fail(f"{_page_id(page)}:{error.lineno}: {error.msg}")
        try:
            exec(code, module.__dict__)
        except ModuleNotFoundError as error:
            # CI re-runs these pages with the extras installed and
            # FILTERAX_DOCS_STRICT=1, where a missing module is a failure.
            if error.name in OPTIONAL_MODULES and not os.environ.get(
                "FILTERAX_DOCS_STRICT"
            ):
                pytest.skip(f"{_page_id(page)} needs {error.name}")
            raise


# --- The collector itself ------------------------------------------------------


def test_code_blocks_finds_python_and_honours_no_run(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        textwrap.dedent(
            """\
            # Title

            ```python
            x = 1
            ```

            <!-- no-run -->
            ```python
            raise RuntimeError
            ```

            ```python {.no-run}
            raise RuntimeError
            ```

            ```bash
            echo not python
            ```

            - a list item:

                ```python
                y = x + 1
                ```
            """
        )
    )
    blocks = code_blocks(page)
    assert [(b.line, b.code, b.run) for b in blocks] == [
        (4, "x = 1", True),
        (9, "raise RuntimeError", False),
        (13, "raise RuntimeError", False),
        (23, "y = x + 1", True),
    ]


def test_the_getting_started_page_is_collected() -> None:
    # Guards against the glob silently matching nothing.
    assert "docs/index.md" in {_page_id(page) for page in _pages()}


def _public_names(namespace: Any) -> set[str]:
    return {
        name
        for name, value in vars(namespace).items()
        if not name.startswith("_")
        and getattr(value, "__module__", "").startswith("filterax")
        and not isinstance(value, types.ModuleType)
    }


NAMESPACES = [
    "filterax",
    "filterax.nn",
    "filterax.debug",
    "filterax.checkpoint",
    "filterax.safetensors",
]


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_api_reference_documents_every_public_name(namespace: str) -> None:
    public = _public_names(importlib.import_module(namespace))
    assert public, f"{namespace} exports nothing: the check would pass vacuously"
    entry = re.compile(rf"^::: {re.escape(namespace)}\.(\w+)\s*$", re.M)
    documented = set()
    for page in (ROOT / "docs" / "api").glob("*.md"):
        documented |= set(entry.findall(page.read_text(encoding="utf-8")))
    assert sorted(public - documented) == []
    assert sorted(documented - public) == []


def test_the_api_index_has_a_table_for_every_namespace() -> None:
    # The MkDocs hook that writes docs/api/index.md, run on the real pages:
    # optional subpackages (not imported by `import filterax`) are listed too.
    path = ROOT / "docs" / "scripts" / "api_index.py"
    spec = importlib.util.spec_from_file_location("api_index", path)
    assert spec is not None and spec.loader is not None
    api_index = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(api_index)
    markdown = api_index.index_markdown(ROOT / "docs" / "api")
    headings = re.findall(r"^## `([\w.]+)`$", markdown, re.M)
    assert headings[0] == "filterax" and headings[1:] == sorted(headings[1:])
    assert sorted(set(NAMESPACES) - set(headings)) == []
    assert "| [`load`][filterax.safetensors.load] | Loads a pytree's" in markdown
    assert "| [`Checkpointer`][filterax.checkpoint.Checkpointer] |" in markdown


_SNIPPET = re.compile(r'^\s*--8<-- "(?P<path>[^"]+)"\s*$')
_SNIPPET_LIKE = re.compile(r"--\s*8\s*<\s*--")


def _snippet_lines() -> list[tuple[str, int, str]]:
    found = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if _SNIPPET_LIKE.search(line):
                found.append((str(page.relative_to(ROOT)), number, line))
    return found


def test_every_snippet_include_is_well_formed_and_its_file_exists() -> None:
    # A mangled marker (`--8 < --`) is not an include at all: the page would show
    # the marker instead of the file, and the strict build would not notice.
    lines = _snippet_lines()
    assert lines, "no page includes a file: the check would pass vacuously"
    for page, number, line in lines:
        match = _SNIPPET.match(line)
        assert match, f"{page}:{number}: malformed include {line.strip()!r}"
        assert (ROOT / match["path"]).is_file(), f"{page}:{number}: no such file"


def test_every_example_is_shown_on_the_examples_page() -> None:
    page = (ROOT / "docs" / "examples.md").read_text(encoding="utf-8")
    included = {
        match["path"]
        for match in map(_SNIPPET.match, page.splitlines())
        if match is not None
    }
    scripts = {f"examples/{path.name}" for path in (ROOT / "examples").glob("*.py")}
    assert sorted(scripts - included) == []
