"""Peak memory and run time of the README's test command (`pytest -q -n 2`),
summed over the whole process tree: the pytest controller, both workers, and
the processes some tests start (the multi-process and subprocess tests).

The resident set size of every process in the tree is read from `/proc`
every half second and summed; shared library pages count once per process,
so this overstates what the machine really needs a little. The workers log
the start of every test to a file (a small pytest plugin loaded with `-p`),
which attributes memory to test modules:

- the peak of the whole tree, with the test each worker was running then;
- per test module, the largest memory of the worker running it (the worker
  and the processes it started, summed): the figures to compare between two
  runs on a busy machine, where which modules happen to overlap in the two
  workers changes from run to run.

Linux only (it reads `/proc`). Run from the repository root:
`python benchmarks/bench_test_memory.py [--top N] [--by-test] [pytest
arguments...]`; by default the README's `-q -n 2`. `--by-test` ranks single
tests instead of modules (with `-n 1`, to see one module's tests). The target is a peak under 3 GB. Nothing is
asserted.
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
    found = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(child) for child in (task / "children").read_text().split()]
    except OSError:
        pass
    return found


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


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class _TestLog:
    """The test each process most recently started, read as the log grows."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.running: dict[int, str] = {}

    def update(self) -> dict[int, str]:
        if self.path.exists():
            with open(self.path) as log:
                log.seek(self.offset)
                for line in log:
                    if not line.endswith("\n"):  # half-written: read it next time
                        break
                    self.offset += len(line.encode())
                    _, pid, nodeid = line.rstrip("\n").split(" ", 2)
                    self.running[int(pid)] = nodeid
        return self.running


def main(argv: list[str]) -> int:
    top, by_test = 12, False
    while argv[:1] in (["--top"], ["--by-test"]):
        if argv[0] == "--top":
            top, argv = int(argv[1]), argv[2:]
        else:
            by_test, argv = True, argv[1:]
    pytest_args = argv or ["-q", "-n", "2"]
    with tempfile.TemporaryDirectory() as scratch:
        plugin = Path(scratch) / "filterax_memory_log.py"
        plugin.write_text(PLUGIN)
        log = _TestLog(Path(scratch) / "tests.log")
        env = dict(os.environ, FILTERAX_TEST_LOG=str(log.path))
        env["PYTHONPATH"] = os.pathsep.join(
            [scratch, *filter(None, [env.get("PYTHONPATH")])]
        )
        command = [sys.executable, "-m", "pytest", *pytest_args]
        command += ["-p", "filterax_memory_log"]
        output = Path(scratch) / "pytest.out"
        start = time.time()
        # Into a file, not a pipe: a long report would fill a pipe nobody
        # reads until the end, and stall pytest.
        with open(output, "w") as sink:
            process = subprocess.Popen(
                command, env=env, stdout=sink, stderr=subprocess.STDOUT
            )
            peak, peak_at, peak_processes = 0, start, 0
            peak_running: dict[int, str] = {}
            per_unit: dict[str, int] = {}
            while process.poll() is None:
                running = log.update()
                total = _rss(process.pid)
                count = 1
                for worker in _children(process.pid):
                    pids = _tree(worker)
                    used = sum(map(_rss, pids))
                    total, count = total + used, count + len(pids)
                    if worker in running:
                        name = running[worker]
                        name = name if by_test else _module(name)
                        per_unit[name] = max(per_unit.get(name, 0), used)
                if total > peak:
                    peak, peak_at, peak_processes = total, time.time(), count
                    peak_running = {
                        pid: nodeid
                        for pid, nodeid in running.items()
                        if pid != process.pid  # the controller logs them too
                    }
                time.sleep(0.5)
        wall = time.time() - start
        lines = output.read_text().strip().splitlines()
        summary = next(
            (line for line in reversed(lines) if " in " in line and "passed" in line),
            lines[-1] if lines else "(no output)",
        )
        print(f"pytest {' '.join(pytest_args)}: {summary}")
        print(f"wall time {wall:.0f} s")
        print(
            f"peak {peak / 1e9:.2f} GB summed over {peak_processes} processes, "
            f"{peak_at - start:.0f} s in; target under 3 GB"
        )
        for pid, nodeid in sorted(peak_running.items()):
            print(f"  worker {pid} was running {nodeid}")
        unit = "test" if by_test else "test module"
        print(f"largest per {unit} (its worker and the processes it started):")
        ranked = sorted(per_unit.items(), key=lambda item: -item[1])
        for name, used in ranked[:top]:
            print(f"  {used / 1e9:5.2f} GB  {name}")
        if process.returncode:
            print("\n".join(lines[-40:]))
        return process.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
