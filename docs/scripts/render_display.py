"""Writes `docs/display-model.html`, the treescope rendering that
`docs/display.md` shows.

Runs the Python code blocks of `docs/display.md` (they build `model`), renders
`model` with `treescope.render_to_html` and wraps it in a standalone page, which
the docs page embeds in an iframe. `tests/test_display_browser.py` opens the
page in headless Chromium.

Run from the repository root after changing the model on the page:
`python docs/scripts/render_display.py`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import treescope

ROOT = Path(__file__).resolve().parent.parent.parent
PAGE = ROOT / "docs" / "display.md"
OUT = ROOT / "docs" / "display-model.html"

_BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def page_model(page: Path = PAGE) -> Any:
    """The `model` that the code blocks of `page` build."""
    namespace: dict[str, Any] = {"__name__": "display_page"}
    for code in _BLOCK.findall(page.read_text(encoding="utf-8")):
        exec(compile(code, str(page), "exec"), namespace)
    return namespace["model"]


def standalone_page(value: Any, *, title: str = "filterax model") -> str:
    """A complete HTML document showing `value` as treescope renders it."""
    # Uncompressed: it shows without waiting for the browser to inflate it.
    body = treescope.render_to_html(value, compressed=False)
    return (
        "<!doctype html>\n<html lang='en'>\n<head><meta charset='utf-8'>"
        f"<title>{title}</title></head>\n<body style='margin: 0.5em'>\n"
        f"{body}\n</body>\n</html>\n"
    )


def main() -> int:
    OUT.write_text(standalone_page(page_model()), encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
