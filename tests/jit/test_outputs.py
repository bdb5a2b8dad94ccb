"""Outputs leaving a `filter_jit` trace (`_compiled.rebuild`): Module outputs are
rebuilt with Python's garbage collector waiting (a training step's new Modules
would otherwise start collections), and it runs again afterwards, whatever
happens."""

from __future__ import annotations

import gc
import threading
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import filterax as fx
from filterax._jit import _compiled
from filterax._tree._split import MixedOutput


class Tag(fx.Module):
    name: str  # non-array leaves: the output is rebuilt by filterax
    index: int


@fx.filter_jit
def tagged(x: jax.Array, count: int) -> tuple[jax.Array, list[Tag]]:
    return 2 * x, [Tag(f"node {i}", i) for i in range(count)]


def test_the_collector_waits_while_a_large_output_is_rebuilt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[bool] = []
    real = _compiled.remember_outputs

    def spy(*args: Any) -> None:
        seen.append(gc.isenabled())
        real(*args)

    monkeypatch.setattr(_compiled, "remember_outputs", spy)
    x = jnp.ones(2)
    tagged(x, 300)
    doubled, tags = tagged(x, 300)
    assert seen and not any(seen)
    assert gc.isenabled()
    assert [tag.name for tag in tags[:2]] == ["node 0", "node 1"]
    assert tags[299].index == 299
    assert doubled.tolist() == [2.0, 2.0]


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


def test_a_failed_rebuild_raises_and_leaves_the_collector_running() -> None:
    output = MixedOutput([], _FailingStatic())  # pyright: ignore[reportArgumentType]
    with pytest.raises(RuntimeError, match="rebuild failed"):
        _compiled.rebuild(output, lambda: [])
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


def test_a_loop_that_replaces_its_outputs_starts_no_collection() -> None:
    # Each call builds 400 Modules (past the collector's threshold of 700 new
    # objects with their dictionaries) while the previous call's are alive;
    # rebinding frees those, and nothing allocated in between may start a
    # collection (a `for` loop in a weak-reference callback once did).
    x = jnp.ones(2)
    out = tagged(x, 400)
    out = tagged(x, 400)
    collections: list[int] = []

    def count(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.collect()
    gc.callbacks.append(count)
    try:
        for _ in range(20):
            out = tagged(x, 400)
    finally:
        gc.callbacks.remove(count)
    assert out[1][399].index == 399
    assert collections == []
