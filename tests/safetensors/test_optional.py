"""`filterax.safetensors` is an optional extra: `import filterax` never
imports it, and without the safetensors package importing it says what to
install."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_import_filterax_does_not_import_safetensors() -> None:
    result = _run(
        """
        import sys
        import filterax
        print("filterax.safetensors" in sys.modules, "safetensors" in sys.modules)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_without_the_package_the_error_names_the_extra() -> None:
    result = _run(
        """
        import sys
        sys.modules["safetensors"] = None  # as if it were not installed
        try:
            import filterax.safetensors
        except ModuleNotFoundError as error:
            print(error.name, "|", error)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "safetensors | filterax.safetensors needs the safetensors package, which "
        'is not installed: pip install "filterax[safetensors]"'
    )
