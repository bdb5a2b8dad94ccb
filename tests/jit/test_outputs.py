"""Outputs leaving a `filter_jit` trace (`_outputs`): how Module outputs are
rebuilt with Python's garbage collector paused."""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import filterax as fx
from filterax._jit._outputs import MixedOutput


class Tag(fx.Module):
    name: str  # non-array leaves: the output is rebuilt by filterax
    index: int


@fx.filter_jit
def tagged(x: jax.Array, count: int) -> tuple[jax.Array, list[Tag]]:
    # One array, so that the compiled call itself allocates almost nothing
    # the collector tracks: the objects counted are the rebuilt Modules.
    return 2 * x, [Tag(f"node {i}", i) for i in range(count)]


class Collections:
    """The collections that start while a test runs, and how many of them
    started inside `MixedOutput.rebuild`."""

    def __init__(self) -> None:
        self.started = 0
        self.inside_rebuild = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase != "start":
            return
        self.started += 1
        frame = sys._getframe()
        while frame is not None:
            if frame.f_code is MixedOutput.rebuild.__code__:
                self.inside_rebuild += 1
                return
            frame = frame.f_back


@pytest.fixture
def collections() -> Iterator[Collections]:
    """Collections seen, with the young generation's threshold lowered to 100
    objects."""
    seen = Collections()
    thresholds = gc.get_threshold()
    gc.set_threshold(100, *thresholds[1:])
    gc.callbacks.append(seen)
    try:
        yield seen
    finally:
        gc.callbacks.remove(seen)
        gc.set_threshold(*thresholds)


def test_no_collection_starts_while_a_large_output_is_rebuilt(
    collections: Collections,
) -> None:
    x = jnp.ones(2)
    tagged(x, 300)  # compile
    # Rebuilding 300 Modules makes 600 tracked objects (instances and their
    # attribute dictionaries): six times the lowered threshold.
    doubled, tags = tagged(x, 300)
    assert collections.inside_rebuild == 0
    assert gc.isenabled()
    assert [tag.name for tag in tags[:2]] == ["node 0", "node 1"]
    assert tags[299].index == 299
    assert doubled.tolist() == [2.0, 2.0]


def test_a_loop_replacing_its_output_stops_collecting(
    collections: Collections,
) -> None:
    x = jnp.ones(2)
    out = tagged(x, 300)
    for _ in range(3):
        out = tagged(x, 300)
    collections.started = 0
    for _ in range(5):
        # Freeing the previous output takes back what rebuilding this one
        # added to the collector's count.
        out = tagged(x, 300)
    del out
    assert collections.started == 0


def test_a_collector_switched_off_by_the_program_stays_off() -> None:
    gc.disable()
    try:
        tagged(jnp.ones(2), 3)
        assert not gc.isenabled()
    finally:
        gc.enable()


class _FailingStatic:
    """Stands in for a `StaticPart` whose rebuild raises."""

    def merge_restoring_refs(self, dynamic: Any, inputs: Any) -> Any:
        assert not gc.isenabled()
        raise RuntimeError("rebuild failed")


def test_the_collector_runs_again_after_a_failed_rebuild() -> None:
    output = MixedOutput([], _FailingStatic())  # pyright: ignore[reportArgumentType]
    with pytest.raises(RuntimeError, match="rebuild failed"):
        output.rebuild(lambda: [])
    assert gc.isenabled()


def test_threads_rebuilding_at_once_leave_the_collector_running() -> None:
    x = jnp.ones(2)
    tagged(x, 50)  # compile once, before the threads start
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(50):
                tagged(x, 50)
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert gc.isenabled()
