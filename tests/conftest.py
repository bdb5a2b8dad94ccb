"""Fixtures shared across the test folders."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench(request: pytest.FixtureRequest) -> Iterator[ModuleType]:
    """The script of `benchmarks/` that the test module names in its `BENCHMARK`
    (`"bench_nn"`, say), imported: for the tests of a benchmark's deterministic
    half."""
    name = request.module.BENCHMARK
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: its Modules are dataclasses, which look their
    # module up in `sys.modules`.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[name]


# --- several hosts, for real: processes joined by `jax.distributed` ---

# Prepended to every worker script: simulated CPU devices, then the
# coordination service on loopback. Set before JAX creates its backends.
_WORKER_PRELUDE = """\
import os
import jax

jax.config.update("jax_num_cpu_devices", int(os.environ["FILTERAX_TEST_DEVICES"]))
jax.config.update("jax_cpu_collectives_implementation", "gloo")
if int(os.environ["FILTERAX_TEST_PROCESSES"]) > 1:
    jax.distributed.initialize(
        coordinator_address=os.environ["FILTERAX_TEST_COORDINATOR"],
        num_processes=int(os.environ["FILTERAX_TEST_PROCESSES"]),
        process_id=int(os.environ["FILTERAX_TEST_PROCESS_ID"]),
        initialization_timeout=60,
        heartbeat_timeout_seconds=30,
        shutdown_timeout_seconds=30,
    )
"""


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ProcessGroupFailed(AssertionError):
    """A worker of `run_processes` exited non-zero or ran past its time."""


@pytest.fixture
def run_processes(tmp_path: Path) -> Callable[..., list[str]]:
    """Runs a Python script in several real processes joined by
    `jax.distributed.initialize` on 127.0.0.1 (a free port), each with its own
    simulated CPU devices, and returns each process's standard output.

    `run(script, processes=2, devices=4, timeout=240, env=None)`: `script` is
    the body of the worker; JAX is configured and the distributed runtime
    initialised before it runs (`processes=1` skips `jax.distributed`, for the
    one-host reference run). If any worker fails or the time runs out, every
    worker is killed and `ProcessGroupFailed` carries all their outputs.
    """

    def run(
        script: str,
        *,
        processes: int = 2,
        devices: int = 4,
        timeout: float = 240,
        env: dict[str, str] | None = None,
    ) -> list[str]:
        worker = tmp_path / f"worker_{len(list(tmp_path.glob('worker_*.py')))}.py"
        worker.write_text(_WORKER_PRELUDE + textwrap.dedent(script))
        base_env = {
            **os.environ,
            "FILTERAX_TEST_COORDINATOR": f"127.0.0.1:{_free_loopback_port()}",
            "FILTERAX_TEST_PROCESSES": str(processes),
            "FILTERAX_TEST_DEVICES": str(devices),
            "JAX_PLATFORMS": "cpu",
            **(env or {}),
        }
        base_env.pop("XLA_FLAGS", None)
        outputs = [tmp_path / f"{worker.stem}.{i}.out" for i in range(processes)]
        workers = []
        for index, output in enumerate(outputs):
            with open(output, "w") as sink:
                workers.append(
                    subprocess.Popen(
                        [sys.executable, str(worker)],
                        env={**base_env, "FILTERAX_TEST_PROCESS_ID": str(index)},
                        cwd=tmp_path,
                        stdout=sink,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + timeout
        failure = None
        try:
            for index, process in enumerate(workers):
                remaining = max(deadline - time.monotonic(), 0.1)
                try:
                    code = process.wait(remaining)
                except subprocess.TimeoutExpired:
                    failure = f"worker {index} ran past {timeout} s"
                    break
                if code != 0:
                    failure = f"worker {index} exited with {code}"
                    break
        finally:
            for process in workers:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        texts = [output.read_text() for output in outputs]
        if failure is not None:
            shown = "\n".join(
                f"--- worker {i} ---\n{text[-4000:]}" for i, text in enumerate(texts)
            )
            raise ProcessGroupFailed(f"{failure}\n{shown}")
        return texts

    return run
