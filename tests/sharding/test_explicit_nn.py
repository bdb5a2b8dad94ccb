"""Tensor parallelism with `nn` layers on `Explicit` mesh axes: a row-parallel
`Linear` (its contracted dimension split) sums its partial products as JAX
asks, so the standard patterns run forward and backward and give the numbers
of `Auto` axes and of one device."""

from __future__ import annotations

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


class Block(fx.Module):
    norm: fx.nn.LayerNorm
    attention: fx.nn.MultiheadAttention
    mlp: fx.nn.MLP

    def __init__(self, *, key: jax.Array):
        attention_key, mlp_key = jax.random.split(key)
        self.norm = fx.nn.LayerNorm(WIDTH)
        self.attention = fx.nn.MultiheadAttention(HEADS, WIDTH, key=attention_key)
        # Column-parallel up-projection, row-parallel down-projection.
        self.mlp = fx.nn.MLP(
            WIDTH,
            WIDTH,
            4 * WIDTH,
            depth=1,
            activation=jax.nn.gelu,
            key=mlp_key,
            axes={
                "first": {"weight": ("mlp", "embed"), "bias": ("mlp",)},
                "last": {"weight": ("embed", "mlp"), "bias": ("embed",)},
            },
        )

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

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.vmap(self.readout)(self.block(x))


def _embed(table: jax.Array, tokens: jax.Array) -> jax.Array:
    """The whole batch looked up at once: on `Explicit` axes JAX cannot gather
    per index under `vmap` from a split batch, so the output sharding is
    given here (rows of the batch split, the table's columns kept)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or AxisType.Explicit not in mesh.axis_types:
        return table[tokens]
    spec = jax.typeof(table).sharding.spec
    columns = spec[1] if len(spec) > 1 else None
    return table.at[tokens].get(out_sharding=P("data", None, columns))


def _loss(model: TinyLanguageModel, tokens: jax.Array) -> jax.Array:
    embedded = _embed(model.embedding.weight, tokens[:, :-1])
    logits = jax.vmap(model)(embedded)
    # One-hot labels: an integer-label gather hits the same JAX limit.
    labels = jax.nn.one_hot(tokens[:, 1:], VOCAB, dtype=logits.dtype)
    return optax.softmax_cross_entropy(logits, labels).mean()


def _tokens() -> np.ndarray:
    return (
        np.random.default_rng(0)
        .integers(0, VOCAB, (BATCH, LENGTH + 1))
        .astype(np.int32)
    )


def _mesh(kind: AxisType) -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind,) * 2)


def _loss_and_grads(kind: AxisType | None) -> tuple[float, Any]:
    """Loss and gradients of the sharded model (on one device for `None`)."""
    key = jax.random.key(0)
    tokens = _tokens()
    if kind is None:
        model = TinyLanguageModel(key=key)
        value, grads = fx.filter_jit(fx.filter_value_and_grad(_loss))(model, tokens)
        return float(value), grads
    mesh = _mesh(kind)
    with jax.set_mesh(mesh):
        model = fx.sharded_init(TinyLanguageModel, mesh, RULES)(key=key)
        rows = jax.device_put(tokens, NamedSharding(mesh, P("data")))
        value, grads = fx.filter_jit(fx.filter_value_and_grad(_loss))(model, rows)
        return float(value), jax.device_get(grads)


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
        out = fx.filter_jit(
            lambda a, b, x: jax.vmap(lambda v: b(jax.nn.relu(a(v))))(x)
        )(first, second, x)
        assert out.sharding.spec == P("data", None)
    single = jax.vmap(lambda v: jax.device_get(second)(jax.nn.relu(first(v))))
    np.testing.assert_allclose(out, single(jnp.arange(32.0).reshape(4, 8)), rtol=1e-5)


def test_a_transformer_on_explicit_axes_matches_auto_axes_and_one_device() -> None:
    value_one, grads_one = _loss_and_grads(None)
    value_auto, grads_auto = _loss_and_grads(AxisType.Auto)
    value_explicit, grads_explicit = _loss_and_grads(AxisType.Explicit)
    np.testing.assert_allclose(value_explicit, value_one, rtol=1e-5)
    np.testing.assert_allclose(value_auto, value_one, rtol=1e-5)
    for grads in (grads_auto, grads_explicit):
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6),
            grads,
            grads_one,
        )


@pytest.mark.parametrize("kind", [AxisType.Auto, AxisType.Explicit], ids=str)
def test_a_sharded_train_step_on_explicit_axes_compiles_once(kind: AxisType) -> None:
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
            value, grads = fx.filter_value_and_grad(_loss)(model, tokens)
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


def test_a_per_index_embedding_lookup_on_explicit_axes_says_what_to_do() -> None:
    mesh = _mesh(AxisType.Explicit)
    tokens = _tokens()[:, 0]
    with jax.set_mesh(mesh):
        embedding = fx.sharded_init(fx.nn.Embedding, mesh, RULES)(
            VOCAB, WIDTH, key=jax.random.key(0)
        )
        assert embedding.weight.sharding.spec == P("model", None)
        split = jax.device_put(tokens, NamedSharding(mesh, P("data")))
        with pytest.raises(ValueError, match=r"Embedding: on `Explicit`.*at once"):
            fx.filter_jit(lambda e, t: jax.vmap(e)(t))(embedding, split)
    # Indices whole and the table split by columns: looked up per index.
    with jax.set_mesh(mesh):
        by_columns = fx.sharded_init(fx.nn.Embedding, mesh, {"embed": "model"})(
            VOCAB, WIDTH, key=jax.random.key(0)
        )
        whole = jax.device_put(tokens, NamedSharding(mesh, P()))
        out = fx.filter_jit(lambda e, t: jax.vmap(e)(t))(by_columns, whole)
    np.testing.assert_allclose(out, jax.device_get(by_columns.weight)[tokens])
