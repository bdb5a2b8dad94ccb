"""The deterministic half of `benchmarks/bench_dispatch.py`: each row's two sides
(filterax, and `jax.jit` on a flat list) compute the same values, so that the
timings compare the same work."""

from __future__ import annotations

from types import ModuleType

import jax
import numpy as np
import pytest

import filterax as fx
from filterax._jit import _describe as _memo

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
        "jax.jit, returns its model",
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


def _check_matrix_row(bench: ModuleType, kind: str, container: str, how: str) -> None:
    """One row of the matrix: the call computes what the model computes; it
    takes the keyed route (the direct one when the model is the function
    itself and the argument an array), traces once, and finds its model
    argument by identity."""
    model = bench.make_model(kind, container, 4)
    ours, wrapper = bench.matrix_call(model, how)
    x = jax.numpy.ones(4)
    expected = model(x)
    np.testing.assert_allclose(ours(x), expected, rtol=1e-6)
    direct = how in ("Module", "bound method")
    assert wrapper.compiled.direct_ok is direct
    inner = wrapper.compiled.direct if direct else wrapper.compiled.keyed
    compilations = inner._cache_size()
    for _ in range(2):
        np.testing.assert_allclose(ours(x), expected, rtol=1e-6)
    assert inner._cache_size() == compilations
    if not direct:
        assert _memo.lookup(id(model)) is not None


@pytest.mark.parametrize("container", ["tuple", "list", "dict", "nested Modules"])
@pytest.mark.parametrize(
    "kind",
    [
        "plain",
        "static float",
        "static function",
        "static default",
        "function field",
        "converter",
        "custom __init__",
        "__check_init__",
        "NonDifferentiable",
        "jax.Ref",
    ],
)
def test_every_class_and_container_takes_the_remembered_keyed_route(
    bench: ModuleType, kind: str, container: str
) -> None:
    assert kind in bench.LAYER_KINDS and container in bench.CONTAINERS
    _check_matrix_row(bench, kind, container, "lambda")


@pytest.mark.parametrize(
    "how",
    ["function", "lambda", "closure", "Module", "bound method", "filter_jit method"],
)
def test_every_callable_takes_the_remembered_keyed_route(
    bench: ModuleType, how: str
) -> None:
    assert how in bench.CALLABLES
    _check_matrix_row(bench, "static default", "list", how)


def test_the_reference_trees_have_the_same_leaves_and_structure_shape(
    bench: ModuleType,
) -> None:
    for kind in bench.LAYER_KINDS:
        model = bench.make_model(kind, "list", 4)
        reference = bench.mirror(model)
        assert jax.tree.leaves(reference) == jax.tree.leaves(model)
        assert (
            jax.tree.structure(reference).num_nodes
            == jax.tree.structure(model).num_nodes
        )
