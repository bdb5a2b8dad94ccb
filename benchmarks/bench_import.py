"""What `import filterax` adds to `import jax`, in fresh processes.

Each round starts two new interpreters: one imports `jax` alone, the other
imports `jax` and then the library, and each reports how long its imports took
(`time.perf_counter` inside the process, so interpreter start-up is left out).
The rounds interleave the two, and the table shows the median and the minimum
of the difference.

Python's bytecode cache is on, in a temporary folder of its own, and one
unmeasured round fills it first: that is what users see from the second import
on. `--no-bytecode` measures with the cache off instead (every module compiled
from source, as under `PYTHONDONTWRITEBYTECODE=1`), which is how the figure of
175 ms in the issue that set the 60 ms target was taken.

Equinox is measured beside filterax when it is installed (the `diffrax` extra
brings it).

    python benchmarks/bench_import.py [--rounds 15] [--no-bytecode]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_PROBE = """
import sys, time
sys.path.insert(0, {root!r})
start = time.perf_counter()
import jax
middle = time.perf_counter()
{extra}
end = time.perf_counter()
print(middle - start, end - middle)
"""


def _run(extra: str, env: dict[str, str]) -> tuple[float, float]:
    code = _PROBE.format(root=str(ROOT), extra=extra)
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return float(out[0]), float(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--no-bytecode", action="store_true")
    args = parser.parse_args()

    env = dict(os.environ)
    cache = tempfile.mkdtemp(prefix="bench-import-")
    if args.no_bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = cache

    libraries = {"filterax": "import filterax"}
    if importlib.util.find_spec("equinox") is not None:
        libraries["equinox"] = "import equinox"
    for extra in libraries.values():  # fills the bytecode cache
        _run(extra, env)

    added: dict[str, list[float]] = {name: [] for name in libraries}
    jax_alone: list[float] = []
    for _ in range(args.rounds):
        jax_alone.append(_run("", env)[0])
        for name, extra in libraries.items():
            added[name].append(_run(extra, env)[1])

    mode = "bytecode cache off" if args.no_bytecode else "bytecode cache on"
    print(f"import time in fresh processes, {args.rounds} rounds, {mode}")
    print(f"  import jax alone: median {statistics.median(jax_alone) * 1e3:6.1f} ms")
    for name, times in added.items():
        print(
            f"  import {name} after jax adds: median "
            f"{statistics.median(times) * 1e3:6.1f} ms, min {min(times) * 1e3:6.1f} ms"
        )
    print("  target: filterax adds at most 60 ms (bytecode cache on)")


if __name__ == "__main__":
    main()
