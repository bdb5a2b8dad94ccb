"""Peak memory of the README's test command (`pytest -q -n 2`), summed over
the whole process tree: the pytest controller, both workers, and the
processes some tests start (the multi-process and subprocess tests).

The resident set size of every process in the tree is read from `/proc`
every half second and summed; shared library pages count once per process,
so this overstates what the machine really needs a little. At the peak, the
test module each worker was running is printed (the workers log the start of
every test to a file, through a small pytest plugin loaded with `-p`).

Linux only (it reads `/proc`). Run from the repository root:
`python benchmarks/bench_test_memory.py [pytest arguments...]`; by default
the README's `-q -n 2`. The target is a peak under 3 GB. Nothing is asserted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")

# Loaded into pytest and its workers with `-p`: appends `time pid nodeid` for
# every test that starts to the file named by FILTERAX_TEST_LOG.
PLUGIN = """
import os, time

def pytest_runtest_logstart(nodeid, location):
    path = os.environ.get("FILTERAX_TEST_LOG")
    if path:
        with open(path, "a") as log:
            log.write(f"{time.time()} {os.getpid()} {nodeid}\\n")
"""


def _children(pid: int) -> list[int]:
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        found = []
        for task in tasks:
            text = (task / "children").read_text()
            found += [int(child) for child in text.split()]
        return found
    except OSError:
        return []


def _tree(root: int) -> list[int]:
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo += _children(pid)
    return pids


def _rss(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _running_at(log: Path, moment: float) -> dict[int, str]:
    """The test each worker had most recently started at `moment`."""
    running: dict[int, str] = {}
    if not log.exists():
        return running
    for line in log.read_text().splitlines():
        stamp, pid, nodeid = line.split(" ", 2)
        if float(stamp) <= moment:
            running[int(pid)] = nodeid
    return running


def main(argv: list[str]) -> int:
    pytest_args = argv or ["-q", "-n", "2"]
    with tempfile.TemporaryDirectory() as scratch:
        plugin = Path(scratch) / "filterax_memory_log.py"
        plugin.write_text(PLUGIN)
        log = Path(scratch) / "tests.log"
        env = dict(os.environ, FILTERAX_TEST_LOG=str(log))
        env["PYTHONPATH"] = os.pathsep.join(
            [scratch, *filter(None, [env.get("PYTHONPATH")])]
        )
        command = [sys.executable, "-m", "pytest", *pytest_args]
        command += ["-p", "filterax_memory_log"]
        start = time.time()
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        peak, peak_at, peak_processes = 0, start, 0
        while process.poll() is None:
            pids = _tree(process.pid)
            total = sum(map(_rss, pids))
            if total > peak:
                peak, peak_at, peak_processes = total, time.time(), len(pids)
            time.sleep(0.5)
        output = process.stdout.read().decode() if process.stdout else ""
        summary = output.strip().splitlines()[-1] if output.strip() else "(no output)"
        print(f"pytest {' '.join(pytest_args)}: {summary}")
        print(f"wall time {time.time() - start:.0f} s")
        print(
            f"peak {peak / 1e9:.2f} GB summed over {peak_processes} processes, "
            f"{peak_at - start:.0f} s in; target under 3 GB"
        )
        for pid, nodeid in sorted(_running_at(log, peak_at).items()):
            print(f"  worker {pid} was running {nodeid}")
        return process.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
