"""The deterministic half of `benchmarks/bench_dispatch.py`: each row's two sides
(filterax, and `jax.jit` on a flat list) compute the same values, so that the
timings compare the same work."""

from __future__ import annotations

from types import ModuleType

import jax
import numpy as np
import pytest

import filterax as fx

BENCHMARK = "bench_dispatch"  # loaded by the `bench` fixture (conftest.py)


def _array_leaves(tree: object) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree) if fx.is_array(leaf)]


@pytest.mark.parametrize(
    "row",
    [
        "static field",
        "jax.jit, same Module",
        "ordinary field",
        "returns its model",
        "mixed leaves",
        "mixed leaves + Ref",
    ],
)
def test_both_sides_of_a_row_compute_the_same_values(
    bench: ModuleType, row: str
) -> None:
    ours, floor = bench.variants(10)[row]
    for _ in range(2):  # the Ref rows count their calls: twice each
        ours_out, floor_out = ours(), floor()
        for mine, theirs in zip(
            _array_leaves(ours_out), _array_leaves(floor_out), strict=True
        ):
            np.testing.assert_allclose(mine, theirs, rtol=1e-6)


def test_both_adam_steps_train_the_same_parameters(bench: ModuleType) -> None:
    model = bench.FieldActivation(bench.make_layers(10), jax.nn.relu)
    x, y = jax.numpy.ones(4), jax.numpy.zeros(4)
    (ours_step, ours), (floor_step, floor) = bench.adam_steps(model, x, y)
    for _ in range(3):
        ours_step()
        floor_step()
    for mine, theirs in zip(_array_leaves(ours["model"]), floor["params"], strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-6)
    for mine, theirs in zip(
        _array_leaves(ours["state"]), _array_leaves(floor["state"]), strict=True
    ):
        np.testing.assert_allclose(mine, theirs, rtol=1e-6)
