"""The deterministic half of `benchmarks/bench_nn.py`: a training step built from
`filterax.nn` layers costs what the same step written in raw JAX costs, and
computes the same thing.

Each network is taken from the benchmark (one home for both definitions): a
small CNN and two transformer blocks, as `filterax.nn` Modules mapped over the
batch with `jax.vmap`, and as plain dicts of arrays with batched `jax.numpy`
code. Sizes are smaller than the benchmark's so that compiling stays cheap.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import jax
import numpy as np
import pytest

import filterax as fx

BENCHMARK = "bench_nn"  # loaded by the `bench` fixture (conftest.py)


def _keys() -> tuple[jax.Array, jax.Array]:
    model_key, data_key = jax.random.split(jax.random.key(0))
    return model_key, data_key


@pytest.fixture(scope="module")
def cnn(bench: ModuleType) -> tuple[Any, Any, tuple[jax.Array, ...]]:
    model_key, data_key = _keys()
    model = bench.make_cnn(4, key=model_key)
    return model, bench.cnn_params(model), bench.cnn_data(8, key=data_key)


@pytest.fixture(scope="module")
def transformer(bench: ModuleType) -> tuple[Any, Any, tuple[jax.Array, ...]]:
    model_key, data_key = _keys()
    model = bench.make_transformer(size=16, num_heads=4, key=model_key)
    data = bench.transformer_data(2, 8, 16, key=data_key)
    return model, bench.transformer_params(model), data


def _flops(cost: Any) -> float:
    if isinstance(cost, list):  # older JAX: one dict per computation
        cost = cost[0]
    return float(cost["flops"])


def _lowered_flops(step: Any, *args: Any) -> float:
    """FLOPs of the program JAX hands to XLA, before XLA optimises it."""
    return _flops(step.lower(*args).cost_analysis())


def test_cnn_step_hands_xla_the_same_flops_as_raw_jax(bench, cnn) -> None:
    model, params, data = cnn
    filtered = _lowered_flops(bench.filterax_step(bench.cnn_loss), model, *data)
    raw = _lowered_flops(bench.raw_step(bench.raw_cnn_loss), params, *data)
    assert filtered == raw > 0


def test_cnn_step_compiles_to_the_same_flops_within_two_percent(bench, cnn) -> None:
    # The programs handed to XLA cost the same (the test above); the pooling
    # differs in layout: `nn.MaxPool2d` pools channels last, as Equinox does
    # (so that gradients agree with Equinox's to the last bit), the raw step
    # channels first, and XLA fuses the two slightly differently.
    model, params, data = cnn
    filtered = bench.compiled_flops(bench.filterax_step(bench.cnn_loss), model, *data)
    raw = bench.compiled_flops(bench.raw_step(bench.raw_cnn_loss), params, *data)
    assert raw > 0
    assert abs(filtered - raw) <= 0.02 * raw


def test_transformer_step_hands_xla_the_same_flops_as_raw_jax(
    bench, transformer
) -> None:
    model, params, data = transformer
    filtered = _lowered_flops(bench.filterax_step(bench.transformer_loss), model, *data)
    raw = _lowered_flops(bench.raw_step(bench.raw_transformer_loss), params, *data)
    assert filtered == raw > 0


def test_transformer_step_compiles_to_the_same_flops_within_one_percent(
    bench, transformer
) -> None:
    # The programs handed to XLA cost the same (the test above). After
    # optimisation they differ slightly: the layers lay some operations out
    # differently from the raw code under `jax.vmap`, and XLA then fuses (and
    # duplicates into more than one fusion) a few elementwise operations
    # differently. The matrix products, nearly all of the work, are the same.
    model, params, data = transformer
    filtered = bench.compiled_flops(
        bench.filterax_step(bench.transformer_loss), model, *data
    )
    raw = bench.compiled_flops(
        bench.raw_step(bench.raw_transformer_loss), params, *data
    )
    assert raw > 0
    assert abs(filtered - raw) <= 0.01 * raw


def _assert_same_loss_and_gradients(
    loss: Any, raw_loss: Any, to_params: Any, model: Any, params: Any, data: Any
) -> None:
    value, grads = fx.filter_jit(fx.filter_value_and_grad(loss))(model, *data)
    raw_value, raw_grads = jax.jit(jax.value_and_grad(raw_loss))(params, *data)
    np.testing.assert_allclose(value, raw_value, rtol=1e-6)
    grads_as_params = to_params(grads)
    assert jax.tree.structure(grads_as_params) == jax.tree.structure(raw_grads)
    for got, expected in zip(
        jax.tree.leaves(grads_as_params), jax.tree.leaves(raw_grads)
    ):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)


def test_cnn_loss_and_gradients_match_raw_jax(bench, cnn) -> None:
    model, params, data = cnn
    _assert_same_loss_and_gradients(
        bench.cnn_loss, bench.raw_cnn_loss, bench.cnn_params, model, params, data
    )


def test_transformer_loss_and_gradients_match_raw_jax(bench, transformer) -> None:
    model, params, data = transformer
    _assert_same_loss_and_gradients(
        bench.transformer_loss,
        bench.raw_transformer_loss,
        bench.transformer_params,
        model,
        params,
        data,
    )
