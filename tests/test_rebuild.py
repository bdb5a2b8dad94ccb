"""The generated builders that rebuild a known structure (`_rebuild`)."""

from __future__ import annotations

import collections
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import optax
import pytest

import filterax as fx
from filterax._tree._rebuild import make_builder
from filterax._tree._split import split


class Plain(fx.Module):
    weight: jax.Array
    label: str = fx.field(static=True, default="plain")


class Custom(fx.Module):
    weight: jax.Array
    scale: float

    def __init__(self, size: int):
        self.weight = jnp.ones(size)
        self.scale = 2.0


class Checked(fx.Module):
    weight: jax.Array
    count: int = fx.field(converter=int, default=1)

    def __check_init__(self) -> None:
        assert self.count >= 0


class Pair(NamedTuple):
    first: Any
    second: Any


class Empty(NamedTuple):
    pass


def _tree() -> Any:
    params = {"w": jnp.ones(2)}
    return (
        [Plain(jnp.ones(3)), Custom(2), Checked(jnp.zeros(1), 3.0)],
        {"b": None, "c": "one", "a": (jnp.arange(2),)},
        {2: jnp.ones(1), 1: "one"},
        Pair(jnp.ones(()), Empty()),
        fx.NonDifferentiable(jnp.ones(4)),
        optax.adam(1e-3).init(params),
        collections.OrderedDict(z=jnp.ones(1), y=2),
        jax.nn.relu,
    )


def _same(a: Any, b: Any) -> None:
    leaves_a, def_a = jtu.tree_flatten(a)
    leaves_b, def_b = jtu.tree_flatten(b)
    assert def_a == def_b
    assert all(x is y for x, y in zip(leaves_a, leaves_b))
    assert fx.tree_equal(a, b)


def test_a_builder_gives_what_jax_unflatten_gives() -> None:
    tree = _tree()
    dynamic, static = split(tree)
    build = make_builder(static.treedef, static.mask, static.static)
    assert build is not None
    rebuilt = build(dynamic)
    _same(rebuilt, tree)
    assert type(rebuilt[0][1]) is Custom and rebuilt[0][1].scale == 2.0
    assert rebuilt[0][0].label == "plain"
    assert isinstance(rebuilt[3], Pair) and isinstance(rebuilt[3].second, Empty)
    assert type(rebuilt[6]) is collections.OrderedDict
    assert list(rebuilt[2]) == [1, 2]


def test_each_build_makes_new_nodes() -> None:
    tree = _tree()
    dynamic, static = split(tree)
    build = make_builder(static.treedef, static.mask, static.static)
    assert build is not None
    first, second = build(dynamic), build(dynamic)
    assert first[0][0] is not second[0][0]
    assert first[0] is not second[0]
    assert first[1] is not second[1]


def test_a_structure_without_modules_is_left_to_jax() -> None:
    dynamic, static = split({"a": [jnp.ones(1), 2], "b": (None,)})
    assert make_builder(static.treedef, static.mask, static.static) is None


class _Reversed(NamedTuple):
    first: Any
    second: Any


# A namedtuple with its own flatten rule (children reversed): the builder's
# literal would put them back the wrong way round, so it must not be used.
jtu.register_pytree_node(
    _Reversed,
    lambda node: ((node.second, node.first), None),
    lambda _, children: _Reversed(children[1], children[0]),
)


def test_a_builder_that_disagrees_with_jax_is_refused() -> None:
    tree = [Plain(jnp.ones(1)), _Reversed(jnp.zeros(1), jnp.ones(2))]
    dynamic, static = split(tree)
    assert make_builder(static.treedef, static.mask, static.static) is None
    static.merge(dynamic)
    rebuilt = static.merge(dynamic)
    _same(rebuilt, tree)
    assert rebuilt[1].first.shape == (1,)


def test_filter_jit_rebuilds_a_returned_model_with_a_builder() -> None:
    @fx.filter_jit
    def step(model: Plain, act: Any) -> tuple[Plain, Any]:
        return jtu.tree_map(lambda w: w + 1, model), act

    model = Plain(jnp.zeros(2))
    for expected in (1.0, 2.0, 3.0):
        model, act = step(model, jax.nn.relu)
        assert model.weight.tolist() == [expected, expected]
        assert model.label == "plain" and act is jax.nn.relu
    key = step.compiled.last_call
    assert key is not None
    out = step.compiled.keyed(key, [*step.fun_dynamic, model.weight])
    assert out.static._build is not None
    assert out.static._build is not out.static._unflatten


@pytest.mark.parametrize("count", [1, 2, 3])
def test_merging_agrees_before_and_after_the_builder(count: int) -> None:
    tree = _tree()
    dynamic, static = split(tree)
    for _ in range(count):
        _same(static.merge(dynamic), tree)
