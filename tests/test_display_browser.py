"""The treescope display on the docs page, opened in a real headless browser.

`docs/display.md` embeds `docs/display-model.html`, which
`docs/scripts/render_display.py` writes from the page's model. These tests
check that the file is up to date, that Chromium shows the model's fields once
treescope's script has run (the DOM dump, shadow roots included), and that a
screenshot of the page is not blank.

They need Chromium (Debian: `apt-get install chromium`). Without it they are
skipped, except where `FILTERAX_BROWSER_REQUIRED=1` (CI sets it after
installing Chromium), where a missing browser fails.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHOWN = ROOT / "docs" / "display-model.html"
FIELDS = ("conv=", "norm=", "dropout=", "head=", "running_max=", "stream=")

# Appended to a copy of the page: once treescope has drawn the tree (inside
# shadow roots, which a DOM dump leaves out), copy the text it shows into
# `<pre id="shown">`.
_COPY_SHOWN_TEXT = """
<script>
window.addEventListener("load", () => setTimeout(() => {
  const texts = [];
  const walk = (root) => root.querySelectorAll("*").forEach((element) => {
    if (element.shadowRoot) {
      element.shadowRoot.querySelectorAll("style").forEach((s) => s.remove());
      texts.push(element.shadowRoot.textContent);
      walk(element.shadowRoot);
    }
  });
  walk(document);
  const pre = document.createElement("pre");
  pre.id = "shown";
  pre.textContent = texts.join(" ");
  document.body.appendChild(pre);
}, 200));
</script>
"""


def _load_script() -> ModuleType:
    path = ROOT / "docs" / "scripts" / "render_display.py"
    spec = importlib.util.spec_from_file_location("render_display", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("FILTERAX_BROWSER_REQUIRED") == "1":
        pytest.fail("FILTERAX_BROWSER_REQUIRED=1 but no Chromium on PATH")
    pytest.skip("needs Chromium (apt-get install chromium)")


def _run_chromium(*arguments: str, cwd: Path) -> str:
    command = [
        _chromium(),
        "--headless",
        "--no-sandbox",  # CI runs as root, where Chromium needs it
        "--disable-gpu",
        # Fewer helper processes: the test suite runs beside two pytest
        # workers, and its peak memory counts each process.
        "--no-zygote",
        "--renderer-process-limit=1",
        "--disable-extensions",
        "--disable-features=Translate,MediaRouter,OptimizationHints",
        "--hide-scrollbars",
        "--virtual-time-budget=3000",  # lets the page's scripts finish
        f"--user-data-dir={cwd / 'profile'}",
        *arguments,
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def _comparable(page: str) -> str:
    """`page` without what may change between two renderings of one model:
    the container's id (random for each rendering), the last digits of
    floats (the tests compile with XLA's backend optimisation off, which can
    round a parameter's initialisation one ulp differently) and with them the
    spaces NumPy aligns its columns with."""
    page = re.sub(r"treescope_out_[0-9a-f]{32}", "treescope_out_ID", page)
    page = re.sub(
        r"\d+\.\d+(?:e[-+]?\d+)?",
        lambda number: f"{float(number.group()):.5g}",
        page,
    )
    return re.sub(r"\s+", "", page)  # NumPy pads its columns to the widest


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and rows of RGB(A) pixels of an 8-bit, non-interlaced PNG
    (what Chromium writes), with the row filters undone."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, chunks, header = 8, [], b""
    while position < len(data):
        (length,) = struct.unpack(">I", data[position : position + 4])
        kind = data[position + 4 : position + 8]
        body = data[position + 8 : position + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks.append(body)
        position += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up = previous[x]
            corner = previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + up) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 0xFF
            elif kind == 4:
                estimate = left + up - corner
                nearest = min(
                    (abs(estimate - left), 0, left),
                    (abs(estimate - up), 1, up),
                    (abs(estimate - corner), 2, corner),
                )[2]
                line[x] = (line[x] + nearest) & 0xFF
        rows.append(bytes(line))
        previous = line
    return (
        width,
        height,
        [b"".join(row[i : i + 3] for i in range(0, stride, channels)) for row in rows],
    )


def test_the_shown_html_is_the_page_models_current_rendering() -> None:
    script = _load_script()
    fresh = script.standalone_page(script.page_model())
    assert _comparable(SHOWN.read_text(encoding="utf-8")) == _comparable(fresh), (
        "docs/display-model.html is stale: run python docs/scripts/render_display.py"
    )


def test_the_docs_page_embeds_the_shown_html() -> None:
    page = (ROOT / "docs" / "display.md").read_text(encoding="utf-8")
    assert '<iframe src="../display-model.html"' in page


def test_chromium_shows_the_model_fields(tmp_path: Path) -> None:
    page = SHOWN.read_text(encoding="utf-8").replace(
        "</body>", _COPY_SHOWN_TEXT + "</body>"
    )
    (tmp_path / "page.html").write_text(page, encoding="utf-8")
    dom = _run_chromium("--dump-dom", (tmp_path / "page.html").as_uri(), cwd=tmp_path)
    match = re.search(r'<pre id="shown">(.*?)</pre>', dom, re.S)
    assert match, "treescope's script did not run"
    shown = match[1]
    assert "Classifier(" in shown
    for field in FIELDS:
        assert field in shown
    assert "float32(4, 1, 3, 3)" in shown  # the conv weight, summarised
    assert "Ref(" in shown and "key&lt;fry&gt;" in shown


def test_a_screenshot_of_the_page_shows_the_model(tmp_path: Path) -> None:
    shot = tmp_path / "shot.png"
    _run_chromium(
        "--window-size=640,400", f"--screenshot={shot}", SHOWN.as_uri(), cwd=tmp_path
    )
    width, height, rows = png_pixels(shot.read_bytes())
    assert (width, height) == (640, 400)
    background = rows[-1][-3:]  # bottom right: below and beside the tree
    drawn = [
        (x, y)
        for y in range(0, height, 2)
        for x in range(0, width, 2)
        if rows[y][3 * x : 3 * x + 3] != background
    ]
    # Text and the coloured boxes of the layers: a blank or failed page has
    # (almost) none. The tree starts at the top left.
    assert len(drawn) > 0.02 * (width // 2) * (height // 2)
    assert min(y for _, y in drawn) < 50 and min(x for x, _ in drawn) < 50
    colours = {rows[y][3 * x : 3 * x + 3] for x, y in drawn}
    assert len(colours) > 20  # coloured boxes and anti-aliased text, not a smudge


def test_png_pixels_reads_a_known_image() -> None:
    # 2x1 RGB: red, green; filter 1 (sub) on the row.
    row = bytes([1, 255, 0, 0, (0 - 255) & 0xFF, 255, 0])
    ihdr = struct.pack(">IIBBBBB", 2, 1, 8, 2, 0, 0, 0)

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    data = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(row))
        + chunk(b"IEND", b"")
    )
    assert png_pixels(data) == (2, 1, [bytes([255, 0, 0, 0, 255, 0])])
