"""`tree_pformat` / `tree_pprint`, and the `repr` of Modules and wrappers."""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest

import filterax as fx


class Linear(fx.Module):
    weight: jax.Array
    bias: jax.Array


class MLP(fx.Module):
    layers: list
    activation: Any = fx.field(static=True, default=jax.nn.relu)

    def apply(self, x: jax.Array) -> jax.Array:
        return x


def _mlp() -> MLP:
    return MLP(
        [Linear(jnp.ones((8, 4)), jnp.ones(8)), Linear(jnp.ones((1, 8)), jnp.ones(1))]
    )


# ------------------------------------------------------------------ leaves


@pytest.mark.parametrize(
    "dtype, name",
    [
        (jnp.float16, "f16"),
        (jnp.bfloat16, "bf16"),
        (jnp.float32, "f32"),
        (jnp.int8, "i8"),
        (jnp.int16, "i16"),
        (jnp.int32, "i32"),
        (jnp.uint8, "u8"),
        (jnp.uint16, "u16"),
        (jnp.uint32, "u32"),
        (jnp.bool_, "bool"),
        (jnp.complex64, "c64"),
    ],
)
def test_array_prints_as_dtype_and_shape(dtype, name):
    assert fx.tree_pformat(jnp.zeros((3, 4), dtype)) == f"{name}[3,4]"


def test_scalar_array_prints_with_empty_shape():
    assert fx.tree_pformat(jnp.float32(1.0)) == "f32[]"


def test_64_bit_numpy_arrays_print_with_a_numpy_suffix():
    assert fx.tree_pformat(np.zeros(3)) == "f64[3](numpy)"
    assert fx.tree_pformat(np.zeros(2, np.int64)) == "i64[2](numpy)"
    assert fx.tree_pformat(np.zeros(2, np.uint64)) == "u64[2](numpy)"
    assert fx.tree_pformat(np.zeros(2, np.complex128)) == "c128[2](numpy)"


def test_numpy_scalar_prints_as_a_numpy_scalar_array():
    assert fx.tree_pformat(np.float32(1.0)) == "f32[](numpy)"


def test_unusual_dtypes_print_with_their_name():
    assert fx.tree_pformat(jnp.zeros(2, jnp.float8_e4m3fn)) == "float8_e4m3fn[2]"
    assert fx.tree_pformat(np.zeros(2, jax.dtypes.float0)) == "float0[2](numpy)"


def test_key_arrays_print_with_their_key_dtype():
    assert fx.tree_pformat(jax.random.key(0)) == "key<fry>[]"
    assert fx.tree_pformat(jax.random.split(jax.random.key(0), 4)) == "key<fry>[4]"
    assert fx.tree_pformat(jax.random.key(0, impl="rbg")) == "key<rbg>[]"


def test_legacy_keys_print_as_uint32_arrays():
    assert fx.tree_pformat(jax.random.PRNGKey(0)) == "u32[2]"


def test_tracers_print_as_their_shape_and_dtype():
    printed = []

    @jax.jit
    def f(x, key):
        printed.append(fx.tree_pformat((x, key)))
        return x

    f(jnp.ones((2, 3)), jax.random.key(0))
    assert printed == ["(f32[2,3], key<fry>[])"]


def test_shape_dtype_struct_uses_its_repr_by_default():
    struct = jax.ShapeDtypeStruct((3,), jnp.float32)
    assert fx.tree_pformat(struct) == repr(struct)


def test_shape_dtype_struct_as_array():
    struct = jax.ShapeDtypeStruct((3, 2), jnp.int32)
    assert fx.tree_pformat(struct, struct_as_array=True) == "i32[3,2]"


def test_short_arrays_false_uses_the_full_repr():
    assert fx.tree_pformat(jnp.arange(3), short_arrays=False) == repr(jnp.arange(3))


def test_full_multi_line_array_repr_stays_aligned():
    text = fx.tree_pformat({"a": np.ones((2, 2))}, short_arrays=False, width=10)
    assert text == "{\n  'a': array([[1., 1.],\n              [1., 1.]])\n}"


def test_python_values_print_with_repr():
    assert (
        fx.tree_pformat([None, 1, 2.5, "s", True, int])
        == "[None, 1, 2.5, 's', True, <class 'int'>]"
    )


def _module_level_function(x):
    return x


def test_functions_print_by_qualified_name():
    def my_function(x):
        return x

    local = "test_functions_print_by_qualified_name.<locals>.my_function"
    assert fx.tree_pformat(my_function) == f"<function {local}>"
    assert (
        fx.tree_pformat(_module_level_function) == "<function _module_level_function>"
    )
    assert fx.tree_pformat(jax.nn.relu) == "<function relu>"
    assert fx.tree_pformat(jax.jit(my_function)) == f"<function {local}>"
    assert fx.tree_pformat(jax.custom_vjp(my_function)) == f"<function {local}>"
    assert fx.tree_pformat(len) == "<function len>"


def test_functions_made_by_functools_wraps_say_so():
    @functools.wraps(_module_level_function)
    def wrapper(x):
        return x

    assert fx.tree_pformat(wrapper) == "<wrapped function _module_level_function>"


def test_weakly_typed_arrays_say_so():
    assert fx.tree_pformat(jnp.asarray(1)) == "weak_i32[]"
    assert fx.tree_pformat(jnp.asarray(1, dtype=jnp.int32)) == "i32[]"
    assert fx.tree_pformat(jnp.broadcast_to(1.0, (2,))) == "weak_f32[2]"


def test_refs_print_with_their_shape():
    assert fx.tree_pformat([jax.new_ref(jnp.zeros(3))]) == "[Ref(f32[3])]"


# ------------------------------------------------------------------ containers


def test_containers_print_like_python():
    assert fx.tree_pformat([jnp.ones(2), (1,), (), {}, {"a": None}]) == (
        "[f32[2], (1,), (), {}, {'a': None}]"
    )


def test_dict_keeps_insertion_order():
    assert fx.tree_pformat({"b": 1, "a": 2}) == "{'b': 1, 'a': 2}"


def test_namedtuple_prints_its_fields():
    Point = collections.namedtuple("Point", "x y")
    assert fx.tree_pformat(Point(jnp.ones(1), 2)) == "Point(x=f32[1], y=2)"


def test_container_subclasses_print_their_name():
    assert fx.tree_pformat(collections.OrderedDict(a=1)) == "OrderedDict({'a': 1})"


def test_long_containers_are_elided():
    assert fx.tree_pformat(list(range(10)), max_items=3) == "[0, 1, 2, ... (7 more)]"
    assert fx.tree_pformat(dict.fromkeys("abcd", 0), max_items=2) == (
        "{'a': 0, 'b': 0, ... (2 more)}"
    )


def test_max_items_none_shows_everything():
    assert fx.tree_pformat(list(range(50)), max_items=None, width=1000).endswith(
        "48, 49]"
    )


def test_default_elides_beyond_32_items():
    assert fx.tree_pformat(list(range(33)), width=1000).endswith("31, ... (1 more)]")


def test_groups_break_one_item_per_line_when_too_wide():
    text = fx.tree_pformat({"first": "x" * 10, "second": [1, 2]}, width=20)
    assert text == "{\n  'first': 'xxxxxxxxxx',\n  'second': [1, 2]\n}"


def test_one_element_tuple_keeps_its_comma_when_broken():
    assert fx.tree_pformat(("x" * 10,), width=5) == "(\n  'xxxxxxxxxx',\n)"


def test_indent_sets_the_indentation_per_level():
    assert fx.tree_pformat([[1, 2]], width=4, indent=4) == (
        "[\n    [\n        1,\n        2\n    ]\n]"
    )


def test_truncate_leaf_prints_name_and_dots():
    text = fx.tree_pformat(
        [[1, 2], {"a": 1}], truncate_leaf=lambda x: isinstance(x, dict)
    )
    assert text == "[[1, 2], dict(...)]"


def test_reference_cycles_print_as_dots():
    cycle: list = [1]
    cycle.append(cycle)
    assert fx.tree_pformat(cycle) == "[1, ...]"


def test_same_object_twice_is_not_a_cycle():
    array = jnp.ones(2)
    shared = [array]
    assert fx.tree_pformat([shared, shared]) == "[[f32[2]], [f32[2]]]"


def test_custom_pytree_node_without_repr_prints_its_children():
    class Node:
        def __init__(self, a: Any, b: Any):
            self.a, self.b = a, b

    jtu.register_pytree_with_keys(
        Node,
        lambda n: (((jtu.GetAttrKey("a"), n.a), (jtu.GetAttrKey("b"), n.b)), None),
        lambda _, children: Node(*children),
    )
    assert fx.tree_pformat(Node(jnp.ones(2), 3)) == "Node(a=f32[2], b=3)"


def test_objects_with_their_own_repr_use_it():
    class Thing:
        def __repr__(self) -> str:
            return "<thing>"

    assert fx.tree_pformat([Thing()]) == "[<thing>]"


# ------------------------------------------------------------------ partials, wrappers


def add(x, y, z=0):
    return x + y + z


def scale(x, factor):
    return x * factor


def test_functools_partial():
    assert fx.tree_pformat(functools.partial(add, 1, z=jnp.ones(2))) == (
        "partial(<function add>, 1, z=f32[2])"
    )


def test_jax_tree_util_partial():
    assert fx.tree_pformat(jtu.Partial(jnp.multiply, jnp.ones(3))) == (
        "Partial(<jnp.ufunc 'multiply'>, f32[3])"
    )


def test_filterax_partial():
    assert fx.tree_pformat(fx.Partial(scale, factor=jnp.ones(3))) == (
        "Partial(<function scale>, factor=f32[3])"
    )
    assert repr(fx.Partial(scale, 2)) == "Partial(<function scale>, 2)"


def test_non_differentiable_repr():
    assert repr(fx.NonDifferentiable(jnp.ones(3))) == "NonDifferentiable(f32[3])"
    assert repr(fx.NonDifferentiable({"a": 1.0})) == "NonDifferentiable({'a': 1.0})"


# ------------------------------------------------------------------ dataclasses, Modules


def test_plain_dataclass_prints_repr_fields_in_order():
    @dataclasses.dataclass
    class Config:
        size: int
        weights: Any
        secret: str = dataclasses.field(default="x", repr=False)

    assert fx.tree_pformat(Config(3, jnp.ones(2))) == "Config(size=3, weights=f32[2])"


def test_module_repr_is_short():
    assert (
        repr(Linear(jnp.ones((8, 4)), jnp.ones(8)))
        == "Linear(weight=f32[8,4], bias=f32[8])"
    )


def test_module_repr_includes_static_fields():
    model = MLP([], activation=jax.nn.gelu)
    assert repr(model) == "MLP(layers=[], activation=<function gelu>)"


def test_nested_modules_are_indented_when_too_wide():
    assert repr(_mlp()) == (
        "MLP(\n"
        "  layers=[\n"
        "    Linear(weight=f32[8,4], bias=f32[8]),\n"
        "    Linear(weight=f32[1,8], bias=f32[1])\n"
        "  ],\n"
        "  activation=<function relu>\n"
        ")"
    )


def test_nested_modules_break_further_in_a_narrow_width():
    assert fx.tree_pformat(_mlp().layers[0], width=20) == (
        "Linear(\n  weight=f32[8,4],\n  bias=f32[8]\n)"
    )


def test_nested_modules_fit_on_one_line_when_wide_enough():
    assert fx.tree_pformat(_mlp(), width=200) == (
        "MLP(layers=[Linear(weight=f32[8,4], bias=f32[8]), "
        "Linear(weight=f32[1,8], bias=f32[1])], activation=<function relu>)"
    )


def test_module_holding_non_differentiable():
    model = Linear(fx.NonDifferentiable(jnp.ones(2)), jnp.ones(2))
    assert repr(model) == "Linear(weight=NonDifferentiable(f32[2]), bias=f32[2])"


def test_bound_method_of_a_module():
    assert fx.tree_pformat(MLP([]).apply) == "<bound method MLP.apply>"


def test_python_bound_method():
    class Thing:
        def go(self) -> None:
            pass

    assert fx.tree_pformat(Thing().go) == "<bound method Thing.go>"


def test_module_repr_under_jit_shows_tracers_as_arrays():
    printed = []

    @jax.jit
    def f(model):
        printed.append(repr(model))
        return model.weight

    f(Linear(jnp.ones(2), jnp.ones(2)))
    assert printed == ["Linear(weight=f32[2], bias=f32[2])"]


def test_tree_pprint_prints(capsys):
    fx.tree_pprint({"w": jnp.ones(2)})
    assert capsys.readouterr().out == "{'w': f32[2]}\n"
