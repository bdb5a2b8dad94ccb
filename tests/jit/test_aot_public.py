"""`filter_jit(f).lower(...)` and its `.compile()` expose JAX's objects as the
public attributes `lowered` and `compiled`, as Equinox does (a ViT library
counts FLOPs with `compiled.compiled.cost_analysis()`; issue 39)."""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp

import filterax as fx


class Affine(fx.Module):
    weight: jax.Array

    @fx.filter_jit
    def __call__(self, x: jax.Array) -> jax.Array:
        return self.weight @ x


def _matmul(weight: jax.Array, x: jax.Array) -> jax.Array:
    return weight @ x


def test_lowered_and_compiled_are_jaxs_objects():
    lowered = fx.filter_jit(_matmul).lower(jnp.ones((4, 3)), jnp.ones(3))
    assert isinstance(lowered.lowered, jax.stages.Lowered)
    compiled = lowered.compile()
    assert isinstance(compiled.compiled, jax.stages.Compiled)
    assert compiled(jnp.ones((4, 3)), jnp.ones(3)).tolist() == [3.0] * 4


def test_cost_analysis_through_the_public_attributes_counts_the_flops():
    compiled = fx.filter_jit(_matmul).lower(jnp.ones((4, 3)), jnp.ones(3)).compile()
    analysis = compiled.compiled.cost_analysis()
    # `[analysis]` on older JAX versions: a list of one dict per computation.
    flops = (analysis[0] if isinstance(analysis, list) else analysis)["flops"]
    assert flops == 2 * 4 * 3
    # The same object answers through the wrapper, as before.
    assert compiled.cost_analysis() == analysis


def test_the_lowered_text_is_the_same_through_either_path():
    lowered = fx.filter_jit(_matmul).lower(jnp.ones((2, 2)), jnp.ones(2))
    assert lowered.lowered.as_text() == lowered.as_text()
    assert "stablehlo" in lowered.lowered.as_text()


def test_a_bound_method_lowers_to_the_same_public_attributes():
    model = Affine(jnp.eye(2))
    lowered = model.__call__.lower(jnp.ones(2))
    assert isinstance(lowered.lowered, jax.stages.Lowered)
    compiled = lowered.compile()
    assert isinstance(compiled.compiled, jax.stages.Compiled)
    assert compiled(jnp.array([1.0, 2.0])).tolist() == [1.0, 2.0]


def test_a_shallow_copy_still_reads_its_attributes():
    lowered = fx.filter_jit(_matmul).lower(jnp.ones((2, 2)), jnp.ones(2))
    copied = copy.copy(lowered)
    assert copied.lowered is lowered.lowered
    compiled = copy.copy(lowered.compile())
    assert compiled(jnp.eye(2), jnp.ones(2)).tolist() == [1.0, 1.0]


def test_filter_pmap_exposes_the_same_public_attributes():
    lowered = fx.filter_pmap(lambda x: 2 * x).lower(jnp.ones((1, 3)))
    assert isinstance(lowered.lowered, jax.stages.Lowered)
    compiled = lowered.compile()
    assert isinstance(compiled.compiled, jax.stages.Compiled)
    assert compiled(jnp.ones((1, 3))).tolist() == [[2.0, 2.0, 2.0]]
    assert copy.copy(compiled).compiled is compiled.compiled
