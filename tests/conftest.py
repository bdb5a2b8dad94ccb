"""Fixtures shared across the test folders."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
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
