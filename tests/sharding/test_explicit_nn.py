"""Tensor parallelism with `nn` layers on `Explicit` mesh axes: a row-parallel
`Linear` (its contracted dimension split) sums its partial products as JAX
asks, and `Embedding` looks up a batch of indices split over the mesh, so the
standard patterns run forward and backward and give the numbers of `Auto`
axes and of one device."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import filterax as fx

RULES = {"heads": "model", "mlp": "model", "vocab": "model", "embed": None}
WIDTH, HEADS, VOCAB, LENGTH, BATCH = 16, 4, 32, 8, 8
# Column-parallel up-projection, row-parallel down-projection.
MLP_AXES = {
    "first": {"weight": ("mlp", "embed"), "bias": ("mlp",)},
    "last": {"weight": ("embed", "mlp"), "bias": ("embed",)},
}


def _mlp(*, key: jax.Array) -> fx.nn.MLP:
    return fx.nn.MLP(
        WIDTH,
        WIDTH,
        4 * WIDTH,
        depth=1,
        activation=jax.nn.gelu,
        key=key,
        axes=MLP_AXES,
    )


class Block(fx.Module):
    norm: fx.nn.LayerNorm
    attention: fx.nn.MultiheadAttention
    mlp: fx.nn.MLP

    def __init__(self, *, key: jax.Array):
        attention_key, mlp_key = jax.random.split(key)
        self.norm = fx.nn.LayerNorm(WIDTH)
        self.attention = fx.nn.MultiheadAttention(HEADS, WIDTH, key=attention_key)
        self.mlp = _mlp(key=mlp_key)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = jax.vmap(self.norm)(x)
        x = x + self.attention(h, h, h)
        return x + jax.vmap(self.mlp)(x)


class TinyLanguageModel(fx.Module):
    embedding: fx.nn.Embedding
    block: Block
    readout: fx.nn.Linear

    def __init__(self, *, key: jax.Array):
        keys = jax.random.split(key, 3)
        self.embedding = fx.nn.Embedding(VOCAB, WIDTH, key=keys[0])
        self.block = Block(key=keys[1])
        self.readout = fx.nn.Linear(
            WIDTH,
            VOCAB,
            key=keys[2],
            axes={"weight": ("vocab", "embed"), "bias": ("vocab",)},
        )

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return jax.vmap(self.readout)(self.block(jax.vmap(self.embedding)(tokens)))


def _language_loss(model: TinyLanguageModel, tokens: jax.Array) -> jax.Array:
    logits = jax.vmap(model)(tokens[:, :-1])
    # One-hot labels: optax's integer-label gather meets JAX's limit on
    # `Explicit` axes (no output sharding for a per-index gather under `vmap`).
    labels = jax.nn.one_hot(tokens[:, 1:], VOCAB, dtype=logits.dtype)
    return optax.softmax_cross_entropy(logits, labels).mean()


def _tokens() -> np.ndarray:
    return (
        np.random.default_rng(0)
        .integers(0, VOCAB, (BATCH, LENGTH + 1))
        .astype(np.int32)
    )


def _features(*shape: int) -> np.ndarray:
    return np.random.default_rng(1).normal(size=shape).astype(np.float32)


# name -> (constructor, rules, inputs, loss); every input is split over "data".
PATTERNS: dict[str, tuple[Callable[..., Any], dict, np.ndarray, Callable]] = {
    "mlp": (
        _mlp,
        RULES,
        _features(BATCH, WIDTH),
        lambda model, x: jnp.sin(jax.vmap(model)(x)).sum(),
    ),
    "attention_heads": (
        lambda *, key: fx.nn.MultiheadAttention(HEADS, WIDTH, key=key),
        RULES,
        _features(BATCH, LENGTH, WIDTH),
        lambda model, x: jnp.sin(jax.vmap(lambda s: model(s, s, s))(x)).sum(),
    ),
    "embedding_vocab": (
        lambda *, key: fx.nn.Embedding(VOCAB, WIDTH, key=key),
        {"vocab": "model", "embed": None},
        _tokens(),
        lambda model, t: jnp.sin(jax.vmap(jax.vmap(model))(t)).sum(),
    ),
    "embedding_embed": (
        lambda *, key: fx.nn.Embedding(VOCAB, WIDTH, key=key),
        {"vocab": None, "embed": "model"},
        _tokens(),
        lambda model, t: jnp.sin(jax.vmap(jax.vmap(model))(t)).sum(),
    ),
    "transformer": (TinyLanguageModel, RULES, _tokens(), _language_loss),
}


def _mesh(kind: AxisType) -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind,) * 2)


def _loss_and_grads(pattern: str, kind: AxisType | None) -> tuple[float, Any, Any]:
    """Loss, gradients and the model of a pattern, sharded on a mesh with
    `kind` axes (on one device for `None`)."""
    make, rules, inputs, loss = PATTERNS[pattern]
    key = jax.random.key(0)
    value_and_grad = fx.filter_jit(fx.filter_value_and_grad(loss))
    if kind is None:
        model = make(key=key)
        value, grads = value_and_grad(model, inputs)
        return float(value), grads, model
    mesh = _mesh(kind)
    with jax.set_mesh(mesh):
        # One rule set for every pattern: names a pattern lacks are expected.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fx.FilteraxWarning)
            model = fx.sharded_init(make, mesh, rules, strict=False)(key=key)
        rows = jax.device_put(inputs, NamedSharding(mesh, P("data")))
        value, grads = value_and_grad(model, rows)
        return float(value), grads, model


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_a_pattern_on_explicit_axes_matches_auto_axes_and_one_device(
    pattern: str,
) -> None:
    value_one, grads_one, _ = _loss_and_grads(pattern, None)
    value_auto, grads_auto, _ = _loss_and_grads(pattern, AxisType.Auto)
    value_explicit, grads_explicit, model = _loss_and_grads(pattern, AxisType.Explicit)
    np.testing.assert_allclose(value_explicit, value_one, rtol=1e-5)
    np.testing.assert_allclose(value_auto, value_one, rtol=1e-5)
    for grads in (grads_auto, grads_explicit):
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-5),
            fx.filter(grads, fx.is_array),
            fx.filter(grads_one, fx.is_array),
        )
    # On `Explicit` axes each gradient is split like its parameter.
    jax.tree.map(
        lambda g, p: None if g is None else _assert_same_sharding(g, p),
        fx.filter(grads_explicit, fx.is_array),
        fx.filter(model, fx.is_array),
    )


def _assert_same_sharding(grad: jax.Array, param: jax.Array) -> None:
    assert grad.sharding.is_equivalent_to(param.sharding, param.ndim)


def test_a_row_parallel_linear_on_explicit_axes_sums_its_partial_products() -> None:
    mesh = _mesh(AxisType.Explicit)
    with jax.set_mesh(mesh):
        up = fx.sharded_init(fx.nn.Linear, mesh, {"out": "model", "in": None})
        down = fx.sharded_init(fx.nn.Linear, mesh, {"out": None, "in": "model"})
        first = up(8, 16, key=jax.random.key(0))
        second = down(16, 8, key=jax.random.key(1))
        assert second.weight.sharding.spec == P(None, "model")
        x = jax.device_put(
            jnp.arange(32.0).reshape(4, 8), NamedSharding(mesh, P("data"))
        )
        hidden, out = fx.filter_jit(
            lambda a, b, x: (
                jax.vmap(a)(x),
                jax.vmap(lambda v: b(jax.nn.relu(a(v))))(x),
            )
        )(first, second, x)
        # Batch split like the input; features like the weight's "out" axis.
        assert hidden.sharding.spec == P("data", "model")
        assert out.sharding.spec == P("data", None)
    single = jax.vmap(lambda v: jax.device_get(second)(jax.nn.relu(first(v))))
    np.testing.assert_allclose(out, single(jnp.arange(32.0).reshape(4, 8)), rtol=1e-5)


@pytest.mark.parametrize("kind", [AxisType.Auto, AxisType.Explicit], ids=str)
def test_a_sharded_train_step_compiles_once(kind: AxisType) -> None:
    mesh = _mesh(kind)
    optimiser = optax.adam(1e-2)
    traces = []
    with jax.set_mesh(mesh):
        model = fx.sharded_init(TinyLanguageModel, mesh, RULES)(key=jax.random.key(0))
        model_shardings = fx.sharding_of(model, mesh, RULES)
        opt_state = fx.filter_jit(optimiser.init)(fx.filter(model, fx.is_array))

        @fx.filter_jit(out_shardings=(None, model_shardings, None))
        def step(model: Any, opt_state: Any, tokens: jax.Array) -> Any:
            traces.append(None)
            value, grads = fx.filter_value_and_grad(_language_loss)(model, tokens)
            updates, opt_state = optimiser.update(
                grads, opt_state, fx.filter(model, fx.is_array)
            )
            return value, fx.apply_updates(model, updates), opt_state

        rows = jax.device_put(_tokens(), NamedSharding(mesh, P("data")))
        losses = []
        for _ in range(4):
            value, model, opt_state = step(model, opt_state, rows)
            losses.append(float(value))
    assert len(traces) == 1
    assert losses[-1] < losses[0]
    assert model.block.mlp.layers[-1].weight.sharding.spec == P(None, "model")
    assert model.embedding.weight.sharding.spec == P("model", None)


def test_an_embedding_on_explicit_axes_looks_up_as_on_one_device() -> None:
    """Every split of the table and of the indices, negative and
    out-of-range indices included, a stack of tables mapped as well."""
    table = _features(VOCAB, WIDTH)
    indices = np.array([[-1, 31, 40, -40], [0, 5, -32, 33]] * 4, np.int32)
    reference = jnp.asarray(table)[indices]

    def loss(embedding: fx.nn.Embedding, tokens: jax.Array) -> jax.Array:
        return jnp.sin(jax.vmap(jax.vmap(embedding))(tokens)).sum()

    expected_grad = jax.grad(loss)(fx.nn.Embedding(weight=table), indices).weight
    lookup_and_grad = fx.filter_jit(
        lambda e, t: (jax.vmap(jax.vmap(e))(t), fx.filter_grad(loss)(e, t))
    )
    mesh = _mesh(AxisType.Explicit)
    with jax.set_mesh(mesh):
        for table_spec in (P("model", None), P(None, "model"), P(), P("data")):
            embedding = fx.nn.Embedding(
                weight=jax.device_put(table, NamedSharding(mesh, table_spec))
            )
            for index_spec in (P("data"), P(None, "model"), P()):
                split = jax.device_put(indices, NamedSharding(mesh, index_spec))
                out, grads = lookup_and_grad(embedding, split)
                np.testing.assert_array_equal(out, reference)
                np.testing.assert_allclose(grads.weight, expected_grad, rtol=1e-6)
                _assert_same_sharding(grads.weight, embedding.weight)
        stack = jax.device_put(
            np.stack([table, -table]), NamedSharding(mesh, P("model", "data"))
        )
        rows = jax.device_put(indices[:2], NamedSharding(mesh, P("model")))

        def stacked_loss(stack: jax.Array, rows: jax.Array) -> jax.Array:
            lookup = jax.vmap(lambda w, i: jax.vmap(fx.nn.Embedding(weight=w))(i))
            return jnp.sin(lookup(stack, rows)).sum()

        grads = jax.jit(jax.grad(stacked_loss))(stack, rows)
        assert grads.sharding.spec == P("model", "data", None)
    expected = jax.grad(stacked_loss)(np.stack([table, -table]), indices[:2])
    np.testing.assert_allclose(grads, expected, rtol=1e-6)
