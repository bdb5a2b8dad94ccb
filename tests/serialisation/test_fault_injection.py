"""Writers killed with SIGKILL at random moments: the checkpoint on disk is
always either the previous one or the new one, whole, and the temporary files
that killed writers leave behind do not accumulate."""

from __future__ import annotations

import os
import random
import re
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

import filterax as fx

LEAVES = 6
LEAF_SIZE = 16_384  # float64 elements: 128 KiB per leaf
TRIALS = 20

# The driver forks one writer per trial (starting 20 Pythons that import JAX
# would take most of a minute); it never starts a JAX backend, so forking is
# safe. It kills the writer itself when told to, before reaping it, so the
# process id it kills cannot have been reused.
DRIVER = textwrap.dedent(
    """
    import os, signal, sys, time
    import numpy as np
    import filterax as fx

    path, leaves, leaf_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

    def slow_spec(f, leaf):
        fx.default_serialise_filter_spec(f, leaf)
        os.write(1, b"leaf\\n")
        time.sleep(0.002)  # spreads the write out, so kills land inside it

    for line in sys.stdin:
        version = int(line)
        tree = [np.full(leaf_size, float(version)) for _ in range(leaves)]
        pid = os.fork()
        if pid == 0:
            try:
                fx.tree_serialise_leaves(path, tree, slow_spec)
                os.write(1, b"saved\\n")
            finally:
                os._exit(0)
        os.write(1, b"forked\\n")
        assert sys.stdin.readline() == "kill\\n"
        os.kill(pid, signal.SIGKILL)  # a zombie, if it already finished: harmless
        _, status = os.waitpid(pid, 0)
        os.write(1, b"done %d\\n" % status)
    """
)


class Driver:
    def __init__(self, path: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", DRIVER, str(path), str(LEAVES), str(LEAF_SIZE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
        )
        self.pending = b""

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode())
        self.process.stdin.flush()

    def read_line(self) -> str:
        assert self.process.stdout is not None
        descriptor = self.process.stdout.fileno()
        while b"\n" not in self.pending:
            ready, _, _ = select.select([descriptor], [], [], 60)  # never hang
            chunk = os.read(descriptor, 4096) if ready else b""
            if not chunk:
                self.process.kill()
                raise AssertionError(f"the driver stopped: {self.close()}")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode()

    def close(self) -> str:
        """Ends the driver (it stops at the end of its input); returns its stderr."""
        _, errors = self.process.communicate(timeout=60)
        return errors.decode()


def temporary_files(directory: Path) -> list[str]:
    pattern = re.compile(r"\.model\.eqx\.[0-9a-f]{12}\.tmp")
    return [name for name in os.listdir(directory) if pattern.fullmatch(name)]


def saved_version(path: Path) -> float:
    like = [np.zeros(LEAF_SIZE) for _ in range(LEAVES)]
    leaves = fx.tree_deserialise_leaves(path, like)
    values = {float(value) for leaf in leaves for value in np.unique(leaf)}
    assert len(values) == 1, f"a mixture of checkpoints: {sorted(values)}"
    return values.pop()


def test_writers_killed_at_random_moments_leave_old_or_new_and_no_pile_of_tmp(
    tmp_path: Path,
) -> None:
    rng = random.Random(20260123)
    path = tmp_path / "model.eqx"
    fx.tree_serialise_leaves(path, [np.full(LEAF_SIZE, 0.0) for _ in range(LEAVES)])
    on_disk, killed_since_last_save = 0.0, 0
    outcomes = []
    driver = Driver(path)
    try:
        for version in range(1, TRIALS + 1):
            driver.send(f"{version}\n")
            # The kill comes after 0 to LEAVES leaves, plus a random delay; or,
            # one time in three, once the writer has finished.
            if rng.random() < 1 / 3:
                leaves_before_kill = LEAVES + 1
            else:
                leaves_before_kill = rng.randrange(LEAVES + 1)
            seen_leaves, forked, finished = 0, False, False
            while not (forked and (finished or seen_leaves >= leaves_before_kill)):
                line = driver.read_line()  # the writer may print before the driver
                assert line in ("forked", "leaf", "saved"), line
                forked = forked or line == "forked"
                seen_leaves += line == "leaf"
                finished = finished or line == "saved"
            time.sleep(rng.uniform(0, 0.004))
            driver.send("kill\n")
            while not driver.read_line().startswith("done"):
                pass
            now = saved_version(path)
            assert now in (on_disk, float(version))
            leftovers = temporary_files(tmp_path)
            if now == version:
                # This write succeeded, so it removed every stale temporary
                # file; its own was renamed into place.
                assert leftovers == []
                killed_since_last_save = 0
            else:
                killed_since_last_save += 1
                assert len(leftovers) <= killed_since_last_save
            outcomes.append(now == version)
            on_disk = now
    finally:
        errors = driver.close()
    assert driver.process.returncode == 0, errors
    assert not all(outcomes), "no writer was killed before it finished"
    assert any(outcomes), "every writer was killed"
    fx.tree_serialise_leaves(path, [np.full(LEAF_SIZE, -1.0) for _ in range(LEAVES)])
    assert temporary_files(tmp_path) == []
    assert saved_version(path) == -1.0
