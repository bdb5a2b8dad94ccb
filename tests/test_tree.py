"""`tree_at` and `tree_equal`."""

from __future__ import annotations

import collections
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import filterax as fx

# ------------------------------------------------------------------ tree_at


def test_tree_at_replaces_a_leaf():
    tree = {"a": [1, 2], "b": 3}
    assert fx.tree_at(lambda t: t["a"][1], tree, 5) == {"a": [1, 5], "b": 3}


def test_tree_at_does_not_modify_its_input():
    tree = {"a": [1, 2], "b": 3}
    fx.tree_at(lambda t: t["a"][1], tree, 5)
    assert tree == {"a": [1, 2], "b": 3}


def test_tree_at_replaces_a_whole_subtree():
    tree = {"a": [1, 2], "b": 3}
    assert fx.tree_at(lambda t: t["a"], tree, (7, 8, 9)) == {"a": (7, 8, 9), "b": 3}


def test_tree_at_replaces_the_root():
    assert fx.tree_at(lambda t: t, [1, 2], "new") == "new"


def _none_is_leaf(x: Any) -> bool:
    return x is None


def test_tree_at_replaces_a_none_leaf_when_none_is_a_leaf():
    tree = [None, None, 1]
    assert fx.tree_at(lambda t: t[1], tree, 5, is_leaf=_none_is_leaf) == [None, 5, 1]


def test_tree_at_replaces_the_only_none_without_is_leaf_as_equinox_does():
    assert fx.tree_at(lambda t: t["b"], {"a": 1, "b": None}, 2) == {"a": 1, "b": 2}
    assert fx.tree_at(lambda t: t[0][0], [[None], 1], replace_fn=str) == [["None"], 1]


def test_tree_at_refuses_one_of_several_nones_without_is_leaf():
    with pytest.raises(ValueError, match=r"None at \[1\], one of several.*is_leaf"):
        fx.tree_at(lambda t: t[1], [None, None, 1], 5)


def test_tree_at_gives_a_bias_to_a_linear_layer_without_one():
    layer = fx.nn.Linear(2, 3, use_bias=False, key=jax.random.key(0))
    with_bias = fx.tree_at(lambda lin: lin.bias, layer, jnp.zeros(3))
    np.testing.assert_allclose(with_bias.bias, jnp.zeros(3))
    assert layer.bias is None


def test_tree_at_index_past_the_end_of_a_list_names_its_key_path():
    with pytest.raises(
        ValueError, match=r"index 5 is out of range for the list at \['a'\]\[1\]"
    ):
        fx.tree_at(lambda t: t["a"][1][5], {"a": [0, [1, 2]]}, 0)


def test_tree_at_index_past_the_end_of_a_module_tuple_is_an_index_error():
    mlp = fx.nn.MLP(2, 3, 4, 1, key=jax.random.key(0))
    with pytest.raises(IndexError, match=r"index 7 .* tuple at \.layers, which has 2"):
        fx.tree_at(lambda m: m.layers[7].weight, mlp, 0.0)


def test_tree_at_index_past_the_end_of_a_namedtuple_names_its_key_path():
    Pair = collections.namedtuple("Pair", "a b")
    with pytest.raises(IndexError, match=r"index 2 .* namedtuple at \['p'\]"):
        fx.tree_at(lambda t: t["p"][2], {"p": Pair(1, 2)}, 0)
    assert fx.tree_at(lambda t: t["p"].b, {"p": Pair(1, 2)}, 0) == {"p": Pair(1, 0)}


def test_tree_at_missing_dict_key_names_its_key_path_and_the_keys():
    with pytest.raises(
        KeyError, match=r"key 'x' is not in the dict at \[0\], whose keys"
    ):
        fx.tree_at(lambda t: t[0]["x"], [{"a": 1, "b": 2}], 0)


def test_tree_at_index_into_a_numpy_leaf_names_the_leaf():
    # Out of range on the NumPy array itself: still an IndexError, as there.
    with pytest.raises(IndexError, match=r"indexes into the leaf at \[0\].*replace_fn"):
        fx.tree_at(lambda t: t[0][3], [np.ones(2)], 0.0)


def test_tree_at_index_into_a_jax_leaf_names_the_leaf():
    with pytest.raises(TypeError, match=r"indexes into the leaf at \.weight"):
        fx.tree_at(lambda m: m.weight[0], Linear(jnp.ones(2), None), 0.0)


def test_tree_at_replaces_a_leaf_with_none():
    assert fx.tree_at(lambda t: t[0], [1, 2], None) == [None, 2]


def test_tree_at_tells_apart_repeated_leaf_objects():
    array = jnp.ones(2)
    out = fx.tree_at(lambda t: t[1], [array, array, array], 0)
    assert out[0] is array and out[1] == 0 and out[2] is array


def test_tree_at_tells_apart_interned_small_ints():
    assert fx.tree_at(lambda t: t[1], (1, 1, 1), 2) == (1, 2, 1)


def test_tree_at_tells_apart_empty_tuples():
    assert fx.tree_at(lambda t: t[1], [(), (), ()], "x") == [(), "x", ()]


def test_tree_at_selects_inside_an_empty_tuple_sibling():
    assert fx.tree_at(lambda t: t["b"], {"a": (), "b": ()}, [1]) == {"a": (), "b": [1]}


def test_tree_at_with_a_sequence_of_nodes():
    tree = {"a": 1, "b": None, "c": [2, 3]}
    out = fx.tree_at(
        lambda t: [t["a"], t["b"], t["c"][0]],
        tree,
        ["A", "B", "C"],
        is_leaf=_none_is_leaf,
    )
    assert out == {"a": "A", "b": "B", "c": ["C", 3]}


def test_tree_at_with_an_empty_sequence_changes_nothing():
    tree = [1, 2]
    assert fx.tree_at(lambda t: [], tree, []) is tree


def test_tree_at_replace_fn_receives_the_original_node():
    array = jnp.arange(3.0)
    seen = []

    def double(x: Any) -> Any:
        seen.append(x)
        return x * 2

    out = fx.tree_at(lambda t: t["w"], {"w": array}, replace_fn=double)
    assert seen == [array] and seen[0] is array
    np.testing.assert_array_equal(out["w"], [0.0, 2.0, 4.0])


def test_tree_at_replace_fn_applies_to_each_node_of_a_sequence():
    out = fx.tree_at(lambda t: (t[0], t[2]), [1, 2, 3], replace_fn=lambda x: -x)
    assert out == [-1, 2, -3]


def test_tree_at_replace_fn_receives_a_whole_subtree():
    out = fx.tree_at(lambda t: t["a"], {"a": [1, 2]}, replace_fn=lambda s: s + [3])
    assert out == {"a": [1, 2, 3]}


def test_tree_at_shares_untouched_subtrees():
    tree = {"a": [1, 2], "b": [3, 4]}
    out = fx.tree_at(lambda t: t["a"][0], tree, 0)
    assert out["b"] is tree["b"]


def test_tree_at_works_on_namedtuples():
    Point = collections.namedtuple("Point", "x y")
    assert fx.tree_at(lambda p: p.y, Point(1, 2), 5) == Point(1, 5)


def test_tree_at_respects_is_leaf():
    tree = [fx.NonDifferentiable(1.0), 2.0]
    out = fx.tree_at(
        lambda t: t[0], tree, replace_fn=lambda n: n, is_leaf=fx.is_non_differentiable
    )
    assert out[0] is tree[0]


def test_tree_at_cannot_index_into_an_is_leaf_node():
    tree = [[1, 2], 3]
    with pytest.raises(ValueError, match="must only index into the structure"):
        fx.tree_at(lambda t: t[0][0], tree, 0, is_leaf=lambda x: x == [1, 2])


def test_tree_at_works_on_custom_pytree_nodes():
    tree = {"p": jtu.Partial(jnp.add, 1.0)}
    out = fx.tree_at(lambda t: t["p"].args[0], tree, 2.0)
    assert out["p"](1.0) == 3.0


def test_tree_at_works_under_jit():
    @jax.jit
    def set_first(tree):
        return fx.tree_at(lambda t: t[0], tree, replace_fn=lambda x: x + 1)

    out = set_first([jnp.zeros(2), jnp.ones(2)])
    np.testing.assert_array_equal(out[0], [1.0, 1.0])


def test_tree_at_needs_exactly_one_replacement():
    with pytest.raises(
        ValueError, match="exactly one of `replace` and `replace_fn`; got neither"
    ):
        fx.tree_at(lambda t: t[0], [1])
    with pytest.raises(ValueError, match="got both"):
        fx.tree_at(lambda t: t[0], [1], 2, replace_fn=lambda x: x)


def test_tree_at_rejects_a_non_callable_where():
    with pytest.raises(TypeError, match="`where` must be a callable"):
        fx.tree_at(0, [1], 2)


def test_tree_at_rejects_a_newly_built_array():
    with pytest.raises(ValueError, match="not a node of `pytree`"):
        fx.tree_at(lambda t: jnp.ones(2), [jnp.ones(2)], 0)


def test_tree_at_rejects_a_computed_value():
    with pytest.raises(ValueError, match="must only index into the structure"):
        fx.tree_at(lambda t: t[0] + 1, [jnp.ones(2)], 0)


def test_tree_at_rejects_a_where_that_depends_on_leaf_values():
    with pytest.raises(ValueError, match="depends on leaf values"):
        fx.tree_at(lambda t: t[0] if isinstance(t[0], int) else t[1], [1, 2], 0)


def test_tree_at_rejects_a_where_that_filters_on_leaf_types_among_nones():
    tree = [None, 1, "s"]
    with pytest.raises(ValueError, match="depends on leaf values"):
        fx.tree_at(lambda t: [x for x in t if isinstance(x, int)], tree, [0])


def test_tree_at_lets_where_filter_out_nones_as_equinox_does():
    tree = [None, 1, None, 2]
    assert fx.tree_at(lambda t: [x for x in t if x is not None], tree, [5, 6]) == [
        None,
        5,
        None,
        6,
    ]


def test_tree_at_selects_the_biases_that_are_not_none_in_an_mlp():
    # The idiom of Equinox programs that re-initialise biases.
    mlp = fx.nn.MLP(2, 3, 4, 2, use_final_bias=False, key=jax.random.key(0))

    def is_linear(x: Any) -> bool:
        return isinstance(x, fx.nn.Linear)

    def biases(m: Any) -> list:
        return [
            layer.bias
            for layer in jax.tree.leaves(m, is_leaf=is_linear)
            if is_linear(layer) and layer.bias is not None
        ]

    out = fx.tree_at(biases, mlp, replace_fn=jnp.ones_like)
    assert [layer.bias is None for layer in out.layers] == [False, False, True]
    for layer in out.layers[:2]:
        np.testing.assert_array_equal(layer.bias, jnp.ones(4))
    assert out.layers[2].weight is mlp.layers[2].weight


def test_tree_at_selects_the_layers_whose_bias_is_none():
    mlp = fx.nn.MLP(2, 3, 4, 2, use_final_bias=False, key=jax.random.key(0))
    out = fx.tree_at(
        lambda m: [layer.weight for layer in m.layers if layer.bias is None],
        mlp,
        replace_fn=jnp.zeros_like,
    )
    np.testing.assert_array_equal(out.layers[2].weight, jnp.zeros((3, 4)))
    assert out.layers[0].weight is mlp.layers[0].weight


def test_tree_at_where_may_branch_on_a_field_being_none():
    model = Linear(jnp.ones(2), None)
    out = fx.tree_at(lambda m: m.weight if m.bias is None else m.bias, model, 0.0)
    assert out.weight == 0.0 and out.bias is None


def test_tree_at_where_returning_the_only_none_among_a_filter():
    model = MLP([Linear(jnp.ones(2), jnp.ones(2)), Linear(jnp.ones(2), None)], 1.0)
    out = fx.tree_at(
        lambda m: [layer.bias for layer in m.layers if layer.bias is None],
        model,
        [jnp.zeros(2)],
    )
    np.testing.assert_array_equal(out.layers[1].bias, jnp.zeros(2))
    assert out.layers[0] is model.layers[0]


def test_tree_at_names_the_none_meant_among_several():
    model = MLP([Linear(jnp.ones(2), None), Linear(jnp.ones(2), None)], None)
    with pytest.raises(
        ValueError,
        match=r"the None at \.layers\[1\]\.bias, one of several Nones in `pytree` "
        r"\(at \.layers\[0\]\.bias, \.layers\[1\]\.bias, \.scale;.*is_leaf",
    ):
        fx.tree_at(lambda m: m.layers[1].bias, model, jnp.zeros(2))


def test_tree_at_rejects_a_none_when_the_tree_holds_no_none():
    with pytest.raises(ValueError, match="is None, and `pytree` holds no None"):
        fx.tree_at(lambda t: None, [1, 2], 0)


def test_tree_at_rejects_a_sequence_element_not_in_the_tree():
    with pytest.raises(ValueError, match="element 1 of the sequence"):
        fx.tree_at(lambda t: [t[0], 5], [1, 2], [0, 0])


def test_tree_at_rejects_a_mismatched_number_of_replacements():
    with pytest.raises(ValueError, match="returned 2 nodes but `replace` has 3"):
        fx.tree_at(lambda t: [t[0], t[1]], [1, 2], [0, 0, 0])


def test_tree_at_rejects_a_single_replacement_for_a_sequence():
    with pytest.raises(TypeError, match="must be a list or tuple"):
        fx.tree_at(lambda t: [t[0], t[1]], [1, 2], 0)


def test_tree_at_rejects_a_node_selected_twice():
    with pytest.raises(ValueError, match=r"selects the node at \[0\] more than once"):
        fx.tree_at(lambda t: [t[0], t[0]], [1, 2], [0, 0])


def test_tree_at_rejects_a_node_and_a_node_inside_it():
    with pytest.raises(ValueError, match=r"\['a'\] and the node at \['a'\]\[0\]"):
        fx.tree_at(lambda t: [t["a"], t["a"][0]], {"a": [1]}, [0, 0])


# ------------------------------------------------------------------ tree_at, Modules


class Linear(fx.Module):
    weight: jax.Array
    bias: jax.Array | None
    activation: Any = fx.field(static=True, default=None)


class MLP(fx.Module):
    layers: list
    scale: Any


def test_tree_at_on_a_nested_module():
    model = MLP(
        [Linear(jnp.ones((2, 2)), jnp.zeros(2)), Linear(jnp.ones(1), None)], 1.0
    )
    out = fx.tree_at(
        lambda m: m.layers[1].bias, model, jnp.ones(1), is_leaf=_none_is_leaf
    )
    assert type(out) is MLP and type(out.layers[1]) is Linear
    np.testing.assert_array_equal(out.layers[1].bias, [1.0])
    assert out.layers[0] is model.layers[0]
    assert model.layers[1].bias is None


def test_tree_at_on_a_module_field_holding_none():
    model = Linear(jnp.ones(2), None)
    out = fx.tree_at(lambda m: m.bias, model, jnp.zeros(2), is_leaf=_none_is_leaf)
    np.testing.assert_array_equal(out.bias, [0.0, 0.0])


def test_tree_at_replaces_a_whole_module():
    model = MLP([Linear(jnp.ones(2), None)], 1.0)
    new_layer = Linear(jnp.zeros(3), None)
    assert fx.tree_at(lambda m: m.layers[0], model, new_layer).layers[0] is new_layer


def test_tree_at_rejects_a_static_field():
    model = Linear(jnp.ones(2), None, activation="relu")
    with pytest.raises(ValueError, match="static fields"):
        fx.tree_at(lambda m: m.activation, model, "tanh")


def test_tree_at_on_a_bound_method_of_a_module():
    class Scale(fx.Module):
        factor: jax.Array

        def apply(self, x: jax.Array) -> jax.Array:
            return self.factor * x

    method = Scale(jnp.array(2.0)).apply
    out = fx.tree_at(lambda m: m.__self__.factor, method, jnp.array(3.0))
    assert float(out(1.0)) == 3.0


def test_tree_at_rejects_a_node_shared_by_several_places():
    class Empty:
        pass

    shared = Empty()
    jtu.register_pytree_node(Empty, lambda e: ((), None), lambda _, __: shared)
    with pytest.raises(ValueError, match="occurs at several places"):
        fx.tree_at(lambda t: t[0], [Empty(), Empty()], 1)


def test_freeze_on_a_module_layer():
    model = MLP([Linear(jnp.ones(2), jnp.ones(2))], 1.0)
    frozen = fx.freeze(model, lambda m: m.layers[0].weight)
    assert isinstance(frozen.layers[0].weight, fx.NonDifferentiable)
    assert frozen.layers[0].bias is model.layers[0].bias


# ------------------------------------------------------------------ tree_at, properties

_POOL = [jnp.ones(2), jnp.arange(3), np.zeros((1, 2)), 0, 1, 2.5, "s", None]


def _trees(with_modules: bool = False) -> st.SearchStrategy:
    leaves = st.sampled_from(_POOL)

    def extend(children: st.SearchStrategy) -> st.SearchStrategy:
        nodes = [
            st.lists(children, max_size=3),
            st.lists(children, max_size=3).map(tuple),
            st.dictionaries(st.sampled_from("abcd"), children, max_size=3),
            children.map(fx.NonDifferentiable),
        ]
        if with_modules:
            nodes.append(st.tuples(children, children).map(lambda c: MLP(*c)))
        return st.one_of(*nodes)

    return st.recursive(leaves, extend, max_leaves=12)


def _child(node: Any, key: Any) -> Any:
    if isinstance(key, jtu.DictKey):
        return node[key.key]
    if isinstance(key, jtu.SequenceKey):
        return node[key.idx]
    if isinstance(node, fx.NonDifferentiable):
        return node._value  # `.value` would rebuild containers (stop_gradient map)
    return getattr(node, key.name)


def _positions(tree: Any, path: tuple = ()) -> list[tuple]:
    """Every place in `tree` (nodes, leaves and `None`s) as a key path."""
    places = [path]
    if tree is None:
        return places
    children, treedef = jtu.tree_flatten_with_path(
        tree, is_leaf=lambda x: x is not tree
    )
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:
        return places
    for keys, child in children:
        places += _positions(child, (*path, *keys))
    return places


def _at(tree: Any, path: tuple) -> Any:
    for key in path:
        tree = _child(tree, key)
    return tree


def _leaf_ids(tree: Any, stop: Any = None) -> dict[str, int]:
    flat = jtu.tree_flatten_with_path(tree, is_leaf=lambda x: x is None or x is stop)[0]
    return {jtu.keystr(path): id(leaf) for path, leaf in flat}


def _is_prefix(a: tuple, b: tuple) -> bool:
    return len(a) <= len(b) and b[: len(a)] == a


_SENTINEL = object()


def _check_only_selected_changed(tree: Any, out: Any, selected: list[tuple]) -> None:
    expected = {
        path: leaf_id
        for path, leaf_id in _leaf_ids(tree).items()
        if not any(path.startswith(jtu.keystr(s)) for s in selected)
    }
    for s in selected:
        expected[jtu.keystr(s)] = id(_SENTINEL)
    # Key strings of siblings cannot be prefixes of each other here: keys are
    # single letters or indices in brackets.
    assert _leaf_ids(out, stop=_SENTINEL) == expected


@settings(max_examples=50, deadline=None)
@given(tree=_trees(), data=st.data())
def test_tree_at_changes_exactly_the_selected_node(tree, data):
    path = data.draw(st.sampled_from(_positions(tree)))
    original = _at(tree, path)
    seen = []

    def replace_fn(node: Any) -> Any:
        seen.append(node)
        return _SENTINEL

    out = fx.tree_at(
        lambda t: _at(t, path), tree, replace_fn=replace_fn, is_leaf=_none_is_leaf
    )
    assert len(seen) == 1 and seen[0] is original
    _check_only_selected_changed(tree, out, [path])
    back = fx.tree_at(lambda t: _at(t, path), out, original, is_leaf=_none_is_leaf)
    assert jtu.tree_structure(back) == jtu.tree_structure(tree)
    assert all(a is b for a, b in zip(jtu.tree_leaves(back), jtu.tree_leaves(tree)))


@settings(max_examples=50, deadline=None)
@given(tree=_trees(), data=st.data())
def test_tree_at_changes_exactly_the_selected_sequence_of_nodes(tree, data):
    candidates = data.draw(st.permutations(_positions(tree)))
    chosen: list[tuple] = []
    for path in candidates[: data.draw(st.integers(0, 4))]:
        if not any(_is_prefix(c, path) or _is_prefix(path, c) for c in chosen):
            chosen.append(path)
    out = fx.tree_at(
        lambda t: [_at(t, p) for p in chosen],
        tree,
        [_SENTINEL] * len(chosen),
        is_leaf=_none_is_leaf,
    )
    _check_only_selected_changed(tree, out, chosen)


@settings(max_examples=30, deadline=None)
@given(tree=_trees(with_modules=True), data=st.data())
def test_tree_at_changes_exactly_the_selected_node_with_modules(tree, data):
    path = data.draw(st.sampled_from(_positions(tree)))
    out = fx.tree_at(lambda t: _at(t, path), tree, _SENTINEL, is_leaf=_none_is_leaf)
    _check_only_selected_changed(tree, out, [path])


# ------------------------------------------------------------------ tree_equal


def test_tree_equal_of_equal_trees():
    tree = {"a": jnp.arange(3), "b": [1.0, "x", None]}
    assert (
        bool(fx.tree_equal(tree, {"a": jnp.arange(3), "b": [1.0, "x", None]})) is True
    )


def test_tree_equal_of_jax_arrays_is_a_jax_bool_as_in_equinox():
    same = fx.tree_equal(jnp.ones(2), jnp.ones(2))
    assert isinstance(same, jax.Array) and same.dtype == jnp.bool_ and bool(same)
    assert not bool(fx.tree_equal(jnp.ones(2), jnp.zeros(2)))
    mixed = fx.tree_equal(np.ones(2, np.float32), jnp.ones(2))
    assert isinstance(mixed, jax.Array) and bool(mixed)


def test_tree_equal_of_numpy_arrays_and_python_leaves_is_a_python_bool():
    assert fx.tree_equal(np.ones(2), np.ones(2)) is True
    assert fx.tree_equal(np.ones(2), np.zeros(2)) is False
    assert fx.tree_equal(np.float32(1), np.array(1, np.float32)) is True
    assert (
        fx.tree_equal(np.array(1.0, np.float32), np.array(1.00001, np.float32)) is False
    )
    assert (
        fx.tree_equal(
            np.array(1.0, np.float32), np.array(1.00001, np.float32), atol=1e-3
        )
        is True
    )


def test_tree_equal_is_false_without_computing_when_a_static_part_differs():
    assert fx.tree_equal([jnp.ones(2), 1], [jnp.ones(2), 2]) is False
    assert fx.tree_equal(np.ones(2, np.float32), jnp.ones(2, jnp.float16)) is False


def test_tree_equal_of_one_tree_is_true():
    assert fx.tree_equal([jnp.ones(1)]) is True


def test_tree_equal_needs_a_tree():
    with pytest.raises(TypeError, match="at least one pytree"):
        fx.tree_equal()


def test_tree_equal_of_many_trees():
    assert fx.tree_equal([1], [1], [1]) is True
    assert fx.tree_equal([1], [1], [2]) is False


def test_tree_equal_differs_on_structure():
    assert fx.tree_equal([1, 2], (1, 2)) is False
    assert fx.tree_equal({"a": 1}, {"b": 1}) is False
    assert fx.tree_equal([1, None], [1, 2]) is False


def test_tree_equal_differs_on_shape():
    assert fx.tree_equal(jnp.ones(2), jnp.ones(3)) is False
    assert fx.tree_equal(jnp.ones((1, 2)), jnp.ones(2)) is False


def test_tree_equal_differs_on_dtype():
    assert fx.tree_equal(jnp.ones(2), jnp.ones(2, jnp.int32)) is False
    assert fx.tree_equal(jnp.ones(2), jnp.ones(2, jnp.bfloat16)) is False


def test_tree_equal_compares_numpy_and_jax_arrays_by_value():
    assert bool(fx.tree_equal(jnp.arange(3), np.arange(3, dtype=np.int32))) is True
    assert bool(fx.tree_equal(np.float32(2), jnp.float32(2))) is True


def test_tree_equal_typematch_tells_numpy_from_jax():
    assert (
        fx.tree_equal(jnp.arange(3), np.arange(3, dtype=np.int32), typematch=True)
        is False
    )
    assert fx.tree_equal(1, 1.0) is True
    assert fx.tree_equal(1, 1.0, typematch=True) is False


def test_tree_equal_array_is_never_a_python_scalar():
    assert fx.tree_equal(jnp.array(1), 1) is False
    assert fx.tree_equal(1.0, np.float64(1.0)) is False


def test_tree_equal_tolerances():
    x, y = jnp.array([1.0, 2.0]), jnp.array([1.0, 2.001])
    assert bool(fx.tree_equal(x, y)) is False
    assert bool(fx.tree_equal(x, y, rtol=1e-2)) is True
    assert bool(fx.tree_equal(x, y, atol=1e-2)) is True
    assert bool(fx.tree_equal(x, y, atol=1e-4)) is False


def test_tree_equal_tolerances_apply_to_python_floats_not_ints():
    assert fx.tree_equal([1.0], [1.0 + 1e-9]) is False
    assert fx.tree_equal([1.0], [1.0 + 1e-9], atol=1e-6) is True
    assert fx.tree_equal([1], [2], atol=5) is False


def test_tree_equal_tolerances_on_bfloat16_and_complex():
    a = jnp.array([1.0, 2.0], jnp.bfloat16)
    assert bool(fx.tree_equal(a, a + jnp.bfloat16(0.01), rtol=0.05)) is True
    c = jnp.array([1 + 1j])
    assert bool(fx.tree_equal(c, c + 1e-6j, atol=1e-4)) is True


def test_tree_equal_compares_integer_arrays_exactly_as_equinox_does():
    assert bool(fx.tree_equal(jnp.arange(3), jnp.arange(3) + 1, atol=1.5)) is False
    assert fx.tree_equal(np.arange(3), np.arange(3) + 1, atol=1.5) is False
    assert bool(fx.tree_equal(jnp.arange(3), jnp.arange(3), atol=1.5)) is True


def test_tree_equal_tolerances_leave_non_numeric_dtypes_exact():
    assert bool(fx.tree_equal(jnp.ones(2, bool), jnp.ones(2, bool), atol=1.0)) is True
    assert bool(fx.tree_equal(jnp.ones(2, bool), jnp.zeros(2, bool), atol=1.0)) is False
    float0 = np.zeros(2, jax.dtypes.float0)
    assert bool(fx.tree_equal(float0, float0, rtol=1e-3)) is True


def test_tree_equal_nan_is_not_equal():
    x = jnp.array([jnp.nan])
    assert bool(fx.tree_equal(x, x)) is False
    assert bool(fx.tree_equal(x, x, atol=1.0)) is False


def test_tree_equal_compares_key_arrays_by_key_data():
    assert bool(fx.tree_equal(jax.random.key(0), jax.random.key(0))) is True
    assert bool(fx.tree_equal(jax.random.key(0), jax.random.key(1))) is False


def test_tree_equal_key_arrays_of_other_implementations_differ():
    fry = jax.random.key(0, impl="threefry2x32")
    rbg = jax.random.key(0, impl="rbg")
    assert fx.tree_equal(fry, rbg) is False


def test_tree_equal_typed_key_is_not_a_legacy_key():
    assert fx.tree_equal(jax.random.key(0), jax.random.PRNGKey(0)) is False


def test_tree_equal_non_array_leaves_use_eq():
    assert fx.tree_equal(["relu", jnp.tanh], ["relu", jnp.tanh]) is True
    assert fx.tree_equal(["relu"], ["tanh"]) is False


def test_tree_equal_sees_inside_non_differentiable():
    assert fx.tree_equal(
        fx.NonDifferentiable(jnp.ones(2)), fx.NonDifferentiable(jnp.ones(2))
    )
    assert not fx.tree_equal(fx.NonDifferentiable(jnp.ones(2)), jnp.ones(2))


def test_tree_equal_under_jit_returns_a_traced_bool():
    @jax.jit
    def equal(x, y):
        result = fx.tree_equal(x, y)
        assert isinstance(result, jax.Array) and result.dtype == jnp.bool_
        return result

    assert bool(equal(jnp.ones(2), jnp.ones(2)))
    assert not bool(equal(jnp.ones(2), jnp.zeros(2)))
    assert not bool(jax.jit(lambda x, y: fx.tree_equal(x, y, rtol=1e-3))(1.0, 2.0))


def test_tree_equal_under_jit_with_static_difference_is_false():
    @jax.jit
    def equal(x):
        return fx.tree_equal([x, 1], [x, 2])

    assert not bool(equal(jnp.ones(2)))


def test_tree_equal_under_jit_compares_key_arrays():
    equal = jax.jit(fx.tree_equal)
    assert bool(equal(jax.random.key(0), jax.random.key(0)))
    assert not bool(equal(jax.random.key(0), jax.random.key(1)))


def test_module_equality_uses_tree_equal():
    a = Linear(jnp.ones(2), None)
    assert a == Linear(jnp.ones(2), None)
    assert a != Linear(jnp.zeros(2), None)
    assert a != Linear(jnp.ones(2), None, activation="relu")


def test_tree_at_where_may_walk_the_tree_with_jax_tree_util():
    out = fx.tree_at(
        lambda t: jax.tree_util.tree_leaves(t), ([1.0, (2.0,)],), [3.0, 4.0]
    )
    assert out == ([3.0, (4.0,)],)


def test_tree_at_errors_keep_the_exception_types_equinox_code_catches():
    # A `where` wrong for the tree itself raises its own error (a missing key
    # is a KeyError); selecting a static field is a TypeError (and a
    # ValueError, as filterax documents).
    with pytest.raises(KeyError):
        fx.tree_at(lambda t: t["missing"], {"a": 1}, 2)

    class Layer(fx.Module):
        weight: jax.Array
        size: int = fx.field(static=True)

    with pytest.raises(TypeError, match="not a node of `pytree`") as info:
        fx.tree_at(lambda m: m.size, Layer(jnp.ones(2), 2), 3)
    assert isinstance(info.value, ValueError)


def test_a_where_failing_only_on_placeholders_keeps_its_exception_type():
    # A `where` that filters leaves by value finds none on the placeholder
    # copy: filterax explains that, with an error that is also an IndexError,
    # the type Equinox lets through.
    tree = {"a": jnp.ones(2), "b": jnp.zeros(3)}
    with pytest.raises(IndexError, match="placeholders") as info:
        fx.tree_at(
            lambda t: [x for x in jax.tree.leaves(t) if fx.is_array(x)][1], tree, 1
        )
    assert isinstance(info.value, ValueError)
