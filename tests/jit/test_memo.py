"""The keyed route's call description and its identity memo (`_describe`):
what is remembered, that it is never stale, never keeps objects alive, and that
every way of describing one call gives the same key (one trace per
compilation)."""

from __future__ import annotations

import collections
import gc
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import filterax as fx
from filterax._jit import _describe as _memo
from filterax._jit._describe import (
    CallKey,
    describe,
    first_argument_leaf_count,
    unpack_key,
)


def _describe(args: tuple, kwargs: dict, last: CallKey | None = None) -> tuple:
    """`(tokens, dynamic leaves, keyword names)` of a call."""
    key, dynamic = describe(args, kwargs, last)
    return key.tokens, dynamic, key.names


class Linear(fx.Module):
    weight: jax.Array
    bias: jax.Array

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.weight @ x + self.bias


class Net(fx.Module):
    layers: tuple[Linear, ...]
    activation: Any  # a function leaf: the call is keyed

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = self.activation(layer(x))
        return x


class WithList(fx.Module):
    weights: list  # a mutable container: remembered with a guard


class Buffered(fx.Module):
    weight: jax.Array
    buffer: fx.NonDifferentiable


def make_net(scale: float = 1.0, depth: int = 2) -> Net:
    layers = tuple(
        Linear(scale * jnp.eye(3) * (i + 1), jnp.full(3, 0.1 * i)) for i in range(depth)
    )
    return Net(layers, jax.nn.relu)


def reference(net: Net, x: jax.Array) -> jax.Array:
    for layer in net.layers:
        x = jax.nn.relu(layer.weight @ x + layer.bias)
    return x


def counted(fun: Any) -> tuple[Any, list[None]]:
    traces: list[None] = []

    def body(*args: Any, **kwargs: Any) -> Any:
        traces.append(None)
        return fun(*args, **kwargs)

    return fx.filter_jit(body), traces


def test_a_module_passed_again_is_found_by_identity() -> None:
    net, x = make_net(), jnp.ones(3)
    forward, traces = counted(lambda net, x: net(x))
    forward(net, x)
    entry = _memo.lookup(id(net))
    assert entry is not None and entry() is net
    key = forward.compiled.last_call
    for _ in range(3):
        np.testing.assert_allclose(forward(net, x), reference(net, x), rtol=1e-6)
    assert forward.compiled.last_call is key
    assert len(traces) == 1


def test_a_returned_model_fed_back_is_found_by_identity() -> None:
    net = make_net()
    optimiser = optax.sgd(0.1)
    state = optimiser.init(fx.trainable(net))

    def step(net: Net, state: Any, x: jax.Array) -> Any:
        loss, grads = fx.filter_value_and_grad(lambda n: (n(x) ** 2).sum())(net)
        updates, state = optimiser.update(grads, state, fx.trainable(net))
        return fx.apply_updates(net, updates), state, loss

    jitted, traces = counted(step)
    plain_net, plain_state = net, state
    x = jnp.ones(3)
    for _ in range(4):
        net, state, loss = jitted(net, state, x)
        assert _memo.lookup(id(net)) is not None
        plain_net, plain_state, plain_loss = step(plain_net, plain_state, x)
        np.testing.assert_allclose(loss, plain_loss, rtol=1e-5)
    np.testing.assert_allclose(
        net.layers[1].weight, plain_net.layers[1].weight, rtol=1e-5
    )
    assert len(traces) == 1


def test_equal_structures_share_one_key_whichever_way_they_were_described() -> None:
    forward, traces = counted(lambda net, x: net(x))
    x = jnp.ones(3)
    first = make_net()
    forward(first, x)  # flattened, then remembered
    rebuilt = fx.filter_jit(lambda net: net)(make_net(2.0))  # remembered as output
    assert _memo.lookup(id(rebuilt)) is not None
    np.testing.assert_allclose(forward(rebuilt, x), reference(rebuilt, x), rtol=1e-6)
    tokens_first = _describe((first, x), {}, None)[0]
    tokens_rebuilt = _describe((rebuilt, x), {}, None)[0]
    assert tokens_first == tokens_rebuilt
    assert tokens_first[0] is tokens_rebuilt[0]  # interned: identity
    assert len(traces) == 1


def test_the_memo_never_keeps_an_object_alive() -> None:
    gc.collect()
    before = len(_memo._ENTRIES)
    forward = fx.filter_jit(lambda net, x: net(x))
    nets = [make_net(float(i)) for i in range(5)]
    for net in nets:
        forward(net, jnp.ones(3))
    assert len(_memo._ENTRIES) == before + 5
    del net, nets
    gc.collect()
    assert len(_memo._ENTRIES) == before


def test_a_module_holding_lists_is_remembered_with_a_guard() -> None:
    model = WithList([jnp.ones(2)])
    total, traces = counted(lambda m: sum(w.sum() for w in m.weights))
    assert float(total(model)) == 2.0
    entry = _memo.lookup(id(model))
    assert entry is not None and entry.guard is not None
    assert float(total(model)) == 2.0 and len(traces) == 1


@pytest.mark.parametrize(
    "change",
    [
        lambda weights: weights.append(jnp.full(2, 3.0)),
        lambda weights: weights.__setitem__(0, jnp.full(2, 3.0)),
        lambda weights: weights.pop(),
        lambda weights: weights.insert(0, jnp.full(2, 3.0)),
    ],
    ids=["append", "replace", "pop", "insert"],
)
def test_a_list_changed_in_place_is_flattened_again(change: Any) -> None:
    # The Module is only shallowly frozen: its list may change in place.
    model = WithList([jnp.ones(2), jnp.ones(2)])
    total = fx.filter_jit(lambda m: sum(w.sum() for w in m.weights))
    assert float(total(model)) == 4.0
    change(model.weights)
    expected = float(sum(w.sum() for w in model.weights))
    assert float(total(model)) == expected


def test_a_dict_changed_in_place_is_flattened_again() -> None:
    class WithDict(fx.Module):
        weights: dict

    model = WithDict({"a": jnp.ones(2), "b": jnp.ones(2)})
    total = fx.filter_jit(lambda m: sum(w.sum() for w in m.weights.values()))
    assert float(total(model)) == 4.0
    model.weights["a"] = jnp.full(2, 5.0)
    assert float(total(model)) == 12.0
    del model.weights["b"]
    assert float(total(model)) == 10.0
    model.weights["c"] = jnp.ones(2)
    assert float(total(model)) == 12.0


def test_a_nested_list_changed_in_place_is_flattened_again() -> None:
    model = WithList([[jnp.ones(2)], (jnp.ones(2), [jnp.ones(2)])])
    leaves = fx.filter_jit(lambda m: sum(w.sum() for w in jax.tree.leaves(m)))
    assert float(leaves(model)) == 6.0
    model.weights[1][1].append(jnp.ones(2))
    assert float(leaves(model)) == 8.0
    model.weights[0][0] = jnp.zeros(2)
    assert float(leaves(model)) == 6.0


def test_a_returned_model_holding_a_list_is_remembered() -> None:
    identity, traces = counted(lambda m: m)
    out = identity(WithList([jnp.ones(2), Linear(jnp.eye(2), jnp.ones(2))]))
    entry = _memo.lookup(id(out))
    assert entry is not None and entry() is out and entry.guard is not None
    again = identity(out)
    assert len(traces) == 1
    assert fx.tree_equal(again, out)


def test_a_module_holding_another_mutable_node_is_not_remembered() -> None:
    class Holder(fx.Module):
        table: Any

    model = Holder(collections.OrderedDict(a=jnp.ones(2)))
    total = fx.filter_jit(lambda m: m.table["a"].sum())
    assert float(total(model)) == 2.0
    assert _memo.lookup(id(model)) is None
    model.table["a"] = jnp.full(2, 2.0)
    assert float(total(model)) == 4.0


def test_ref_values_are_read_at_every_call() -> None:
    class Counter(fx.Module):
        count: Any

    counter = Counter(jax.new_ref(jnp.zeros(())))

    @fx.filter_jit
    def bump(counter: Counter, label: str) -> jax.Array:
        counter.count[...] += 1.0
        return counter.count[...]

    for expected in (1.0, 2.0, 3.0):
        assert float(bump(counter, "tag")) == expected
    assert _memo.lookup(id(counter)) is not None
    counter.count[...] = jnp.array(10.0)
    assert float(bump(counter, "tag")) == 11.0


def test_non_differentiable_buffers_are_remembered() -> None:
    model = Buffered(jnp.ones(2), fx.NonDifferentiable(jnp.arange(2.0)))
    total = fx.filter_jit(lambda m, scale: scale * (m.weight + m.buffer.value).sum())
    assert float(total(model, 2)) == 6.0
    assert _memo.lookup(id(model)) is not None
    assert float(total(model, 2)) == 6.0


def test_static_leaves_of_equal_value_but_other_type_compile_apart() -> None:
    scale, traces = counted(lambda x, factor: x * factor)
    x = jnp.ones(2)
    for factor in (1, 1.0, True, 1):
        scale(x, factor)
    assert len(traces) == 3


def test_tuples_namedtuples_and_none_are_walked() -> None:
    Pair = collections.namedtuple("Pair", "left right")

    def body(pair: Any, nothing: None, nested: tuple) -> Any:
        assert isinstance(pair, Pair) and nothing is None
        return pair.left.weight.sum() + nested[0][1] * nested[1]

    jitted, traces = counted(body)
    a, b = Linear(jnp.ones((2, 2)), jnp.zeros(2)), Linear(jnp.eye(2), jnp.ones(2))
    for _ in range(2):
        out = jitted(Pair(a, b), None, ((0, jnp.array(2.0)), 3))
        assert float(out) == 10.0
    tokens = _describe((Pair(a, b), None, ((0, 2.0), 3)), {}, None)[0]
    assert tokens[:2] == [Pair, 2] and None in tokens
    assert len(traces) == 1


def test_a_namedtuple_registered_as_a_custom_node_is_flattened() -> None:
    class Swapped(NamedTuple):
        first: Any
        second: Any

    jax.tree_util.register_pytree_node(
        Swapped,
        lambda s: ((s.second, s.first), "swapped"),
        lambda _, children: Swapped(children[1], children[0]),
    )
    value = Swapped(jnp.ones(1), "label")
    tokens, dynamic, _ = _describe((value,), {}, None)
    assert tokens[0].__class__ is not type  # a StaticPart, not a walked tuple
    args, _ = unpack_key(CallKey(tokens, ()), dynamic)
    assert type(args[0]) is Swapped and args[0].second == "label"
    assert args[0].first is dynamic[0]
    jitted = fx.filter_jit(lambda s: s.first * 2)
    np.testing.assert_allclose(jitted(value), [2.0])


def test_keyword_arguments_are_described_by_name() -> None:
    jitted, traces = counted(lambda x, *, scale, shift: x * scale + shift)
    x = jnp.ones(2)
    assert jitted(x, scale=2.0, shift=jnp.ones(2)).tolist() == [3.0, 3.0]
    assert jitted(x, shift=jnp.ones(2), scale=2.0).tolist() == [3.0, 3.0]
    assert len(traces) == 1


def test_unhashable_static_leaf_in_a_tuple_names_its_path() -> None:
    jitted = fx.filter_jit(lambda x, options: x)
    with pytest.raises(TypeError, match=r"args\[1\]\[0\]"):
        jitted(jnp.ones(1), ({1, 2},))


def test_unpack_key_rebuilds_the_arguments() -> None:
    net = make_net()
    args = (net, (jnp.ones(2), "label"), None)
    kwargs = {"scale": 3, "x": jnp.zeros(1)}
    tokens, dynamic, names = _describe(args, kwargs, None)
    key = CallKey(tokens, names)
    assert first_argument_leaf_count(key, args) == len(
        jax.tree.leaves(fx.trainable(net))
    )
    rebuilt_args, rebuilt_kwargs = unpack_key(key, dynamic)
    assert fx.tree_equal(rebuilt_args, args) and rebuilt_args[1][1] == "label"
    assert set(rebuilt_kwargs) == {"scale", "x"} and rebuilt_kwargs["scale"] == 3


def test_outputs_inside_an_outer_trace_are_not_remembered() -> None:
    inner = fx.filter_jit(lambda net: net)
    seen: list[Any] = []

    @jax.jit
    def outer(x: jax.Array) -> jax.Array:
        net = inner(Net((Linear(jnp.eye(3) * x, jnp.zeros(3)),), jax.nn.relu))
        seen.append(_memo.lookup(id(net)))
        return net.layers[0].weight.sum()

    assert float(outer(jnp.array(2.0))) == 6.0
    assert seen == [None]


def test_donated_models_fed_back_keep_working() -> None:
    @fx.filter_jit(donate="all-except-first")
    def step(net: Net, weights: tuple[jax.Array, ...]) -> tuple[Net, tuple]:
        return net, tuple(w + 1 for w in weights)

    net = make_net()
    weights = (jnp.zeros(2), jnp.zeros(2))
    for expected in (1.0, 2.0, 3.0):
        net, weights = step(net, weights)
        assert [float(w[0]) for w in weights] == [expected, expected]
        assert not net.layers[0].weight.is_deleted()  # the first is kept


def test_aot_compiled_calls_check_the_description() -> None:
    jitted = fx.filter_jit(lambda net, x: net(x))
    net = make_net()
    compiled = jitted.lower(net, jnp.ones(3)).compile()
    np.testing.assert_allclose(compiled(net, jnp.ones(3)), reference(net, jnp.ones(3)))
    with pytest.raises(ValueError, match="differ from the ones it was lowered"):
        compiled(make_net(depth=3), jnp.ones(3))
    with pytest.raises(TypeError, match="differ from the ones it was lowered"):
        compiled(net, jnp.ones(4))  # a TypeError too, as Equinox raises


def test_a_list_of_layers_with_static_functions_is_not_flattened_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 30's known case: layers keeping their activation in a static field
    # with a default, held in a list, called through a lambda.
    class Layer(fx.Module):
        weight: jax.Array
        activation: Any = fx.field(static=True, default=jax.nn.relu)

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.activation(self.weight @ x)

    model = WithList([Layer(jnp.eye(2)) for _ in range(4)])
    forward: Any = fx.filter_jit(lambda m, x: [layer(x) for layer in m.weights][-1])
    forward(model, jnp.ones(2))
    flattened: list[Any] = []
    real_split = _memo.split_by_kind
    monkeypatch.setattr(
        _memo,
        "split_by_kind",
        lambda tree: flattened.append(tree) or real_split(tree),
    )
    for _ in range(3):
        assert forward(model, jnp.ones(2)).tolist() == [1.0, 1.0]
    assert flattened == []
    assert forward.compiled.keyed._cache_size() == 1
