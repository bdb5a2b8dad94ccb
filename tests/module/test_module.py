"""Behaviour of `filterax.Module`."""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import gc
import inspect
import pickle
import threading
import typing
import warnings
import weakref
from typing import Any, ClassVar

import beartype
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import jaxtyping
import numpy as np
import pytest
from jaxtyping import Array, Float

import filterax as fx
from filterax._module import _construction


class Linear(fx.Module):
    weight: jax.Array
    bias: jax.Array

    def __call__(self, x):
        return self.weight @ x + self.bias

    def scaled(self, x, factor):
        return factor * self(x)


def make_linear() -> Linear:
    return Linear(jnp.arange(6.0).reshape(2, 3), jnp.ones(2))


# --- dataclass and pytree behaviour ------------------------------------------------


def test_subclass_is_a_dataclass_without_a_decorator():
    assert dataclasses.is_dataclass(Linear)
    assert [f.name for f in dataclasses.fields(Linear)] == ["weight", "bias"]


def test_fields_are_children_in_declaration_order_with_getattr_key_paths():
    model = make_linear()
    paths = [path for path, _ in jtu.tree_leaves_with_path(model)]
    assert paths == [(jtu.GetAttrKey("weight"),), (jtu.GetAttrKey("bias"),)]


def test_flatten_unflatten_round_trip_keeps_type_and_values():
    model = make_linear()
    leaves, treedef = jtu.tree_flatten(model)
    rebuilt = jtu.tree_unflatten(treedef, leaves)
    assert type(rebuilt) is Linear
    assert rebuilt.weight is model.weight and rebuilt.bias is model.bias


def test_unflatten_does_not_run_init_converters_or_checks():
    calls = []

    class Checked(fx.Module):
        x: object = fx.field(converter=lambda v: calls.append("convert") or v)

        def __check_init__(self):
            calls.append("check")

    model = Checked(1.0)
    assert calls == ["convert", "check"]
    jtu.tree_map(lambda _: object(), model)
    assert calls == ["convert", "check"]


def test_tree_map_with_none_leaves_builds_a_module():
    mapped = jtu.tree_map(lambda _: None, make_linear())
    assert type(mapped) is Linear
    assert mapped.weight is None and mapped.bias is None


def test_generated_init_accepts_positional_keyword_and_defaults():
    class Config(fx.Module):
        a: int
        b: float = 2.0
        c: list = dataclasses.field(default_factory=list)
        d: int = dataclasses.field(default=4, kw_only=True)

    config = Config(1, c=[3], d=5)
    assert (config.a, config.b, config.c, config.d) == (1, 2.0, [3], 5)
    assert Config(1).c is not Config(1).c
    with pytest.raises(TypeError):
        Config(1, 2.0, [3], 5)


def test_non_default_field_after_default_is_a_clear_error():
    with pytest.raises(TypeError, match="field 'b' without a default follows"):

        class Bad(fx.Module):
            a: int = 1
            b: int


def test_missing_argument_to_generated_init_is_a_type_error():
    with pytest.raises(TypeError, match="bias"):
        Linear(jnp.ones((2, 3)))


# --- custom __init__, immutability, checks -----------------------------------------


def test_custom_init_may_assign_fields():
    class Affine(fx.Module):
        weight: jax.Array
        size: int = fx.field(static=True)

        def __init__(self, size, key):
            self.size = size
            self.weight = jax.random.normal(key, (size,))

    model = Affine(3, jax.random.key(0))
    assert model.size == 3 and model.weight.shape == (3,)


def test_assignment_after_init_raises_frozen_instance_error():
    model = make_linear()
    with pytest.raises(dataclasses.FrozenInstanceError, match="'bias'.*immutable"):
        model.bias = jnp.zeros(2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        del model.bias


def test_custom_init_that_misses_a_field_names_it():
    class Incomplete(fx.Module):
        a: int
        b: int

        def __init__(self):
            self.a = 1

    with pytest.raises(TypeError, match=r"Field 'b' was not initialized"):
        Incomplete()


def test_custom_init_assigning_an_undeclared_attribute_names_it():
    class Sloppy(fx.Module):
        a: int

        def __init__(self):
            self.a = 1
            self.typo = 2

    with pytest.raises(AttributeError, match="no field 'typo'"):
        Sloppy()
    with pytest.raises(dataclasses.FrozenInstanceError):  # as Equinox raises
        Sloppy()


def test_init_state_does_not_leak_after_a_failing_init():
    class Failing(fx.Module):
        a: int

        def __init__(self):
            self.a = 1
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        Failing()
    assert fx._module._construction._INITIALISING == set()


@pytest.mark.parametrize("post_init", [False, True])
def test_subclass_custom_init_calls_parent_init(post_init):
    # With a `__post_init__`, the parent's generated `__init__` runs it marked
    # as initialising; it must not take off the mark of the subclass's
    # `__init__`, still running.
    namespace = {"__annotations__": {"a": int}}
    if post_init:
        namespace["__post_init__"] = lambda self: None
    Base = type(fx.Module)("Base", (fx.Module,), namespace)

    expected = (
        pytest.warns(UserWarning, match="__post_init__")
        if post_init
        else contextlib.nullcontext()
    )
    with expected:

        class Child(Base):
            b: int

            def __init__(self, a, b):
                super().__init__(a)
                self.b = b

    child = Child(1, 2)
    assert (child.a, child.b) == (1, 2)
    assert jtu.tree_leaves(child) == [1, 2]
    with pytest.raises(dataclasses.FrozenInstanceError):
        child.b = 3  # type: ignore[misc]


def test_subclass_without_init_inherits_custom_init():
    class Base(fx.Module):
        a: int

        def __init__(self, value):
            self.a = value * 10

    class Child(Base):
        pass

    assert Child(2).a == 20


def test_fields_are_inherited_in_order():
    class Base(fx.Module):
        a: int

    class Child(Base):
        b: int

    assert [f.name for f in dataclasses.fields(Child)] == ["a", "b"]
    assert Child(1, 2).b == 2


def test_check_init_runs_for_every_class_in_the_mro():
    seen = []

    class Base(fx.Module):
        a: int

        def __check_init__(self):
            seen.append("base")
            if self.a < 0:
                raise ValueError("a must be non-negative")

    class Child(Base):
        def __check_init__(self):
            seen.append("child")

    Child(1)
    assert sorted(seen) == ["base", "child"]
    with pytest.raises(ValueError, match="non-negative"):
        Child(-1)


def test_check_init_runs_after_a_custom_init():
    class Positive(fx.Module):
        a: int

        def __init__(self, a):
            self.a = a

        def __check_init__(self):
            if self.a <= 0:
                raise ValueError("not positive")

    with pytest.raises(ValueError, match="not positive"):
        Positive(0)


def test_post_init_may_assign_fields():
    class Derived(fx.Module):
        a: int
        b: int = dataclasses.field(init=False)

        def __post_init__(self):
            self.b = self.a * 2

    assert Derived(3).b == 6


def test_an_init_false_field_holding_a_float_array_warns_once():
    # As Equinox: such a leaf is differentiated itself, not through the
    # fields it was computed from.
    class Norm(fx.Module):
        a: jax.Array
        length: jax.Array = fx.field(init=False)

        def __post_init__(self):
            self.length = jnp.abs(self.a)

    with pytest.warns(
        UserWarning, match=r"Norm.length is a `field\(init=False\)`"
    ) as caught:
        Norm(jnp.array(3.0))
    assert caught[0].filename == __file__  # names the line that built it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Norm(jnp.array(4.0))  # once per class and field


def test_an_init_false_field_holding_layers_or_a_python_float_warns():
    # Equinox looks at every leaf of the value, Python floats included.
    class Stack(fx.Module):
        size: int
        layers: list = fx.field(init=False)

        def __post_init__(self):
            self.layers = [jnp.ones(self.size), "tag"]

    class Scaled(fx.Module):
        size: int
        scale: float = fx.field(init=False)

        def __post_init__(self):
            self.scale = 1 / self.size

    class Counted(fx.Module):
        size: int
        count: int = fx.field(init=False)

        def __post_init__(self):
            self.count = 2 * self.size

    with pytest.warns(UserWarning, match=r"Stack.layers is a `field\(init=False\)`"):
        Stack(2)
    with pytest.warns(UserWarning, match=r"Scaled.scale is a `field\(init=False\)`"):
        Scaled(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Counted(2)  # an int is no floating-point value


def test_defining_setattr_is_refused():
    with pytest.raises(TypeError, match="__setattr__"):

        class Mutable(fx.Module):
            def __setattr__(self, name, value):
                pass


# --- fields: static and converter ---------------------------------------------------


def test_static_field_lives_in_the_treedef():
    class WithStatic(fx.Module):
        weight: jax.Array
        name: str = fx.field(static=True)

    model = WithStatic(jnp.ones(2), "layer")
    leaves, treedef = jtu.tree_flatten(model)
    assert len(leaves) == 1
    other = WithStatic(jnp.ones(2), "other")
    assert jtu.tree_structure(other) != treedef
    assert jtu.tree_unflatten(treedef, leaves).name == "layer"


def test_numpy_array_in_static_field_warns_too():
    class ArrayStatic(fx.Module):
        table: object = fx.field(static=True)

    with pytest.warns(fx.StaticArrayWarning, match="ArrayStatic.table"):
        ArrayStatic(np.ones(2))


def test_jax_array_in_static_field_warns_once():
    class ArrayStatic(fx.Module):
        table: object = fx.field(static=True)

    with pytest.warns(fx.StaticArrayWarning, match="ArrayStatic.table"):
        ArrayStatic(jnp.ones(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ArrayStatic(jnp.ones(3))


@pytest.mark.parametrize("value", [[1, 2], {"a": 1}])
def test_unhashable_static_values_are_accepted_as_in_equinox(value):
    # JAX compares static values with `==`: a list or dict works under
    # `filter_jit`, `jax.jit` and `tree_equal`, and equal values share a trace.
    class Config(fx.Module):
        weight: jax.Array
        options: object = fx.field(static=True)

    traces = []

    @fx.filter_jit
    def double(config):
        traces.append(config.options)
        return config.weight * 2

    config = Config(jnp.ones(2), value)
    np.testing.assert_array_equal(double(config), jnp.full(2, 2.0))
    np.testing.assert_array_equal(double(Config(jnp.ones(2), value)), jnp.full(2, 2.0))
    np.testing.assert_array_equal(jax.jit(lambda c: c.weight)(config), jnp.ones(2))
    assert fx.tree_equal(config, Config(jnp.ones(2), value))
    assert len(traces) == 1
    other = [*value, 3] if isinstance(value, list) else {**value, "b": 2}
    double(Config(jnp.ones(2), other))  # another value: another trace
    assert traces == [value, other]


def test_unhashable_static_value_set_by_a_custom_init_is_accepted():
    class Config(fx.Module):
        options: object = fx.field(static=True)

        def __init__(self):
            self.options = ["a"]

    assert Config().options == ["a"]
    assert jax.tree.leaves(Config()) == []


def test_converter_runs_in_generated_init():
    class Converted(fx.Module):
        x: jax.Array = fx.field(converter=jnp.asarray)

    assert isinstance(Converted(1.5).x, jax.Array)


def test_converter_runs_on_assignment_in_custom_init():
    class Converted(fx.Module):
        x: jax.Array = fx.field(converter=jnp.asarray)

        def __init__(self, value):
            self.x = value

    assert isinstance(Converted(1.5).x, jax.Array)


def test_field_rejects_static_inside_metadata():
    with pytest.raises(ValueError, match="static"):
        fx.field(metadata={"static": True})


# --- abstract attributes ---------------------------------------------------------------


def test_unresolved_abstract_var_blocks_instantiation():
    class Shape(fx.Module):
        sides: fx.AbstractVar[int]

    with pytest.raises(TypeError, match="AbstractVar 'sides'"):
        Shape()
    assert dataclasses.fields(Shape) == ()


def test_abstract_var_resolved_by_field_or_property():
    class Shape(fx.Module):
        sides: fx.AbstractVar[int]

    class ByField(Shape):
        sides: int

    class ByProperty(Shape):
        @property
        def sides(self):
            return 3

    assert ByField(4).sides == 4
    assert ByProperty().sides == 3


def test_abstract_class_var_needs_a_class_attribute():
    class Activation(fx.Module):
        name: fx.AbstractClassVar[str]

    class Unresolved(Activation):
        pass

    class ReLU(Activation):
        name: ClassVar[str] = "relu"

    with pytest.raises(TypeError, match="AbstractClassVar 'name'"):
        Unresolved()
    assert ReLU().name == "relu"


def test_string_annotations_are_recognised():
    namespace: dict = {}
    exec(
        "from __future__ import annotations\n"
        "import filterax as fx\n"
        "class Shape(fx.Module):\n"
        "    sides: fx.AbstractVar[int]\n"
        "    scale: float = 1.0\n",
        namespace,
    )
    with pytest.raises(TypeError, match="AbstractVar 'sides'"):
        namespace["Shape"]()


def test_is_abstract_class_keyword_blocks_only_that_class():
    class Base(fx.Module, is_abstract=True):
        x: int

    class Concrete(Base):
        pass

    with pytest.raises(TypeError, match="is_abstract=True"):
        Base(1)
    assert Concrete(2).x == 2


@pytest.mark.parametrize("strict", [True, False])
def test_strict_class_keyword_of_equinox_code_is_accepted(strict):
    class Layer(fx.Module, strict=strict):
        x: int

    assert Layer(1).x == 1


@pytest.mark.parametrize(
    "config, abstract",
    [
        ({}, False),
        ({"force_abstract": False}, False),
        ({"force_abstract": True}, True),
        ({"force_abstact": True}, True),  # Equinox's spelling
        ({"allow_method_override": True}, False),
    ],
)
def test_strict_config_of_equinox_code_makes_abstract_only_when_forced(
    config, abstract
):
    class Layer(fx.Module, strict=fx.StrictConfig(**config)):
        x: int

    class Concrete(Layer):
        pass

    assert Concrete(2).x == 2
    if abstract:
        with pytest.raises(TypeError, match="abstract"):
            Layer(1)
    else:
        assert Layer(1).x == 1


def test_abc_abstractmethod_blocks_instantiation():
    class Layer(fx.Module):
        @abc.abstractmethod
        def forward(self, x): ...

    class Concrete(Layer):
        def forward(self, x):
            return x

    with pytest.raises(TypeError, match="abstract"):
        Layer()
    assert Concrete().forward(1) == 1


# --- methods as pytrees, Partial --------------------------------------------------------


def test_bound_method_is_a_pytree_over_the_module():
    model = make_linear()
    method = model.scaled
    assert isinstance(method, fx.BoundMethod)
    assert jtu.tree_leaves(method) == jtu.tree_leaves(model)
    rebuilt = jtu.tree_map(lambda x: 2 * x, method)
    np.testing.assert_allclose(rebuilt(jnp.ones(3), 1.0), 2 * model(jnp.ones(3)))


def test_bound_method_shows_the_functions_doc_and_annotations():
    # As a bound method does: `help`, `typing.get_type_hints` and beartype
    # read them; a `filter_jit` of it copies them too.
    class Counter(fx.Module):
        start: int

        def add(self, x: int) -> int:
            """Adds `x` to the start."""
            return self.start + x

    bound = Counter(1).add
    assert bound.__doc__ == "Adds `x` to the start."
    assert typing.get_type_hints(bound) == {"x": int, "return": int}
    assert typing.get_type_hints(fx.filter_jit(bound)) == {"x": int, "return": int}
    assert fx.filter_jit(bound).__doc__ == "Adds `x` to the start."
    with pytest.raises(beartype.roar.BeartypeCallHintParamViolation):
        beartype.beartype(bound)("not an int")  # type: ignore[arg-type]
    # The class keeps its own docstring.
    assert fx.BoundMethod.__doc__.startswith("A method bound to a Module instance")


def test_beartype_class_decorator_checks_methods_that_still_bind():
    @beartype.beartype
    class Counter(fx.Module):
        start: int

        def add(self, x: int) -> int:
            return self.start + x

        def broken(self) -> int:
            return "not an int"  # type: ignore[return-value]

        @jax.jit
        def jitted(self, x):  # left alone by beartype, as in a plain class
            return self.start * x

    counter = Counter(1)
    assert counter.add(2) == 3
    assert isinstance(counter.add, fx.BoundMethod)
    assert jax.tree.leaves(counter.add) == [1]
    with pytest.raises(beartype.roar.BeartypeCallHintParamViolation):
        counter.add("2")  # type: ignore[arg-type]
    with pytest.raises(beartype.roar.BeartypeCallHintReturnViolation):
        counter.broken()
    assert counter.jitted(2.0) == 2.0
    assert isinstance(counter.jitted, fx.BoundMethod)


def test_bound_method_under_jax_jit_traces_module_arrays():
    model = make_linear()
    traces = []

    @jax.jit
    def run(method, x):
        traces.append(None)
        return method(x, 2.0)

    run(model.scaled, jnp.ones(3))
    bigger = Linear(model.weight + 1, model.bias)
    np.testing.assert_allclose(run(bigger.scaled, jnp.ones(3)), 2 * bigger(jnp.ones(3)))
    assert len(traces) == 1


def test_class_access_returns_the_plain_function():
    assert Linear.scaled.__name__ == "scaled"
    assert make_linear().scaled.__name__ == "scaled"
    assert make_linear().scaled.__self__ is not None


class _Mixin:
    """Not a Module: its methods are inherited by one."""

    def total(self, x):
        return (self.w * x).sum()


def test_methods_of_a_mixin_jit_decorated_or_attached_later_are_pytrees():
    class Model(fx.Module, _Mixin):
        w: jax.Array

        @jax.jit
        def jitted(self, x):
            return (self.w * x).sum()

    def attached(self, x):
        return (self.w * x).sum()

    Model.attached = attached
    model = Model(jnp.array([1.0, 2.0]))
    for name in ("total", "jitted", "attached"):
        method = getattr(model, name)
        assert isinstance(method, fx.BoundMethod), name
        assert method.__self__ is model
        assert jtu.tree_leaves(method) == [model.w]
        # The gradient flows to the model through the method (it was `None`).
        grads = fx.filter_grad(lambda f: f(1.0))(method)
        np.testing.assert_allclose(grads.__self__.w, [1.0, 1.0])
        assert jax.jit(lambda f, x: f(x))(method, 2.0) == 6.0
    assert Model.total is _Mixin.total
    assert Model.attached is attached


def test_dunder_methods_are_not_wrapped():
    assert not isinstance(make_linear().__call__, fx.BoundMethod)


def test_staticmethod_classmethod_and_property_still_work():
    class Tools(fx.Module):
        a: int

        @staticmethod
        def double(x):
            return 2 * x

        @classmethod
        def build(cls):
            return cls(1)

        @property
        def twice(self):
            return self.double(self.a)

    assert Tools.build().twice == 2


def test_partial_binds_and_is_a_pytree():
    partial = fx.Partial(jnp.add, jnp.array(1.0))
    assert partial(2.0) == 3.0
    assert jtu.tree_leaves(partial) == [jnp.add, partial.args[0]]
    doubled = jtu.tree_map(lambda x: x if callable(x) else 2 * x, partial)
    assert doubled(2.0) == 4.0


def test_partial_keywords():
    partial = fx.Partial(lambda a, b=0: a - b, b=jnp.array(1.0))
    assert partial(3.0) == 2.0


# --- equality, hash, repr, pickle ---------------------------------------------------------


def test_equality_is_tree_equal():
    assert make_linear() == make_linear()
    other = Linear(jnp.zeros((2, 3)), jnp.ones(2))
    assert not (make_linear() == other)


def test_modules_of_different_classes_with_the_same_fields_are_not_equal():
    class Scale(fx.Module):
        w: jax.Array

    class Shift(fx.Module):
        w: jax.Array

    class Scale2(Scale):
        pass

    w = jnp.ones(2)
    assert Scale(w) == Scale(w)
    assert not (Scale(w) == Shift(w))
    assert not (Scale(w) == Scale2(w))
    assert fx.tree_equal([Scale(w)], [Shift(w)]) is False


def test_hash_works_for_hashable_leaves_and_agrees_with_equality():
    class Config(fx.Module):
        a: int
        b: str

    assert hash(Config(1, "x")) == hash(Config(1, "x"))
    assert {Config(1, "x"), Config(1, "x")} == {Config(1, "x")}


def test_hash_of_array_leaves_fails():
    with pytest.raises(TypeError):
        hash(make_linear())


def test_repr_is_the_short_pretty_form():
    assert repr(make_linear()) == "Linear(weight=f32[2,3], bias=f32[2])"


def test_pickle_round_trip():
    class_ = Linear
    model = make_linear()
    restored = pickle.loads(pickle.dumps(model))
    assert type(restored) is class_ and restored == model


def test_a_bound_method_pickles_as_its_function_and_instance():
    model = make_linear()
    restored = pickle.loads(pickle.dumps(model.scaled))
    assert type(restored) is fx.BoundMethod and restored.__self__ == model
    np.testing.assert_allclose(
        restored(jnp.ones(3), 2.0), model.scaled(jnp.ones(3), 2.0)
    )


def test_dataclasses_replace_builds_a_modified_copy():
    model = make_linear()
    replaced = dataclasses.replace(model, bias=jnp.zeros(2))
    assert replaced.bias.sum() == 0 and model.bias.sum() == 2


# --- jaxtyping runtime checking -----------------------------------------------------------


def test_jaxtyped_module_checks_fields_and_names_the_mismatch():
    @jaxtyping.jaxtyped(typechecker=beartype.beartype)
    class Typed(fx.Module):
        weight: Float[Array, "out inp"]
        bias: Float[Array, " out"]

    Typed(jnp.ones((3, 2)), jnp.ones(3))
    with pytest.raises(Exception, match="bias") as info:
        Typed(jnp.ones((3, 2)), jnp.ones(4))
    assert "TypeCheckError" in type(info.value).__name__ or "type" in str(info.value)


def test_jaxtyped_module_still_unflattens_with_arbitrary_leaves():
    @jaxtyping.jaxtyped(typechecker=beartype.beartype)
    class Typed(fx.Module):
        weight: Float[Array, " n"]

    model = Typed(jnp.ones(2))
    assert jtu.tree_map(lambda _: None, model).weight is None


def test_jaxtyped_custom_init_checks_its_string_annotated_arguments():
    # This file has `from __future__ import annotations`: the annotations of
    # a custom `__init__` are strings, resolved in this module's globals.
    @jaxtyping.jaxtyped(typechecker=beartype.beartype)
    class Scaled(fx.Module):
        weight: Float[Array, " n"]

        def __init__(self, weight: Float[Array, " n"], scale: float):
            self.weight = weight.reshape(-1) * scale

    Scaled(jnp.ones(2), 2.0)
    with pytest.raises(jaxtyping.TypeCheckError):
        Scaled(jnp.ones((2, 2), int), 1.0)
    with pytest.raises(jaxtyping.TypeCheckError):
        Scaled(jnp.ones(2), "2")  # type: ignore[arg-type]


# --- resources and threads ----------------------------------------------------------------


def test_instances_are_garbage_collected():
    holder = make_linear()
    module_ref = weakref.ref(holder)
    del holder
    gc.collect()
    assert module_ref() is None


def test_concurrent_construction_with_custom_init_is_safe():
    class Custom(fx.Module):
        a: int

        def __init__(self, a):
            self.a = a

    errors = []

    def build(offset):
        try:
            for i in range(300):
                assert Custom(offset + i).a == offset + i
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=build, args=(k * 1000,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert fx._module._construction._INITIALISING == set()


def test_import_hook_checks_module_fields(tmp_path, monkeypatch):
    source = (
        "import filterax as fx\n"
        "from jaxtyping import Array, Float\n"
        "class Pair(fx.Module):\n"
        "    left: Float[Array, ' n']\n"
        "    right: Float[Array, ' n']\n"
    )
    (tmp_path / "hooked_models.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with jaxtyping.install_import_hook("hooked_models", "beartype.beartype"):
        import hooked_models  # noqa: PLC0415
    hooked_models.Pair(jnp.ones(2), jnp.ones(2))
    with pytest.raises(Exception, match="right"):
        hooked_models.Pair(jnp.ones(2), jnp.ones(3))


def test_unknown_keyword_to_a_class_with_checks_is_a_type_error():
    class Checked(fx.Module):
        a: int

        def __check_init__(self):
            pass

    with pytest.raises(TypeError, match="unexpected keyword argument 'b'"):
        Checked(a=1, b=2)


def test_naming_every_field_by_keyword_still_runs_converters_and_checks():
    class Converted(fx.Module):
        a: jax.Array = fx.field(converter=jnp.asarray)

    assert isinstance(Converted(a=1.0).a, jax.Array)


def test_unpickling_registers_a_class_never_constructed_in_this_process():
    class Fresh(fx.Module):
        weight: jax.Array

    assert not Fresh.__filterax_plan__.registered
    restored = fx._module._construction.unpickle(Fresh, {"weight": jnp.ones(2)})
    assert len(jtu.tree_leaves(restored)) == 1


def test_replacing_init_after_registration_keeps_unflatten_working():
    class Plain(fx.Module):
        weight: jax.Array

    model = Plain(jnp.ones(2))  # registers the class without the marker
    calls = []
    original = Plain.__init__

    def logging_init(self, *args, **kwargs):
        calls.append(kwargs)
        original(self, *args, **kwargs)

    Plain.__init__ = logging_init
    rebuilt = jtu.tree_map(lambda _: None, model)
    assert rebuilt.weight is None and calls == []
    Plain(jnp.zeros(2))
    assert len(calls) == 1


def test_unflatten_never_runs_a_custom_init_whose_parameters_are_not_fields():
    calls = []

    class Layer(fx.Module):
        weight: jax.Array

        def __init__(self, size, key):
            calls.append(size)
            self.weight = jax.random.normal(key, (size,))

    layer = Layer(3, jax.random.key(0))
    treedef = jtu.tree_structure(layer)
    assert "Layer" in str(treedef) and "class" not in str(treedef).lower()
    assert jtu.tree_unflatten(treedef, [None]).weight is None
    assert calls == [3]


def test_unflatten_never_runs_a_custom_init_that_takes_the_fields_by_name():
    calls = []

    class Transposed(fx.Module):
        weight: jax.Array

        def __init__(self, weight):
            calls.append(weight)
            self.weight = weight.T

    model = Transposed(weight=jnp.ones((2, 3)))
    assert model.weight.shape == (3, 2)
    rebuilt = jtu.tree_map(lambda x: x, model)
    assert rebuilt.weight.shape == (3, 2) and len(calls) == 1
    assert Transposed(weight=jnp.ones((2, 3))).weight.shape == (3, 2)


def test_a_converter_that_raises_names_the_field():
    class Positive(fx.Module):
        x: float = fx.field(converter=lambda v: float(v))

    with pytest.raises(ValueError, match=r"Positive\.x: the field's converter.*raised"):
        Positive("not a number")


def test_converters_run_after_init_and_post_init_before_check_init():
    seen = []

    class Converted(fx.Module):
        x: jax.Array = fx.field(converter=jnp.asarray)

        def __post_init__(self):
            seen.append(("post_init", type(self.x)))

        def __check_init__(self):
            seen.append(("check_init", type(self.x)))

    Converted(1.0)
    assert seen[0] == ("post_init", float)
    assert seen[1][0] == "check_init" and issubclass(seen[1][1], jax.Array)


def test_custom_init_with_post_init_warns_that_post_init_will_not_run():
    class Base(fx.Module):
        x: int

        def __post_init__(self):
            raise AssertionError("never run")

    with pytest.warns(UserWarning, match="`__init__` method and a `__post_init__`"):

        class Child(Base):
            def __init__(self):
                self.x = 1

    assert Child().x == 1


def test_generic_modules_keep_their_orig_class():
    from typing import Generic, TypeVar

    T = TypeVar("T")

    class Box(fx.Module, Generic[T]):
        pass

    assert Box[int]().__orig_class__ == Box[int]


def test_generated_init_inherits_a_docstring_set_on_the_parent_init():
    class Parent(fx.Module):
        x: int

    Parent.__init__.__doc__ = "Builds one."

    class Child(Parent):
        pass

    assert Child.__init__.__doc__ == "Builds one."


def test_a_field_overridden_by_a_subclass_property_is_not_instance_state():
    class Abstract(fx.Module):
        size: int = fx.field(init=False)

    class Concrete(Abstract):
        @property
        def size(self):
            return 3

    concrete = Concrete()
    assert concrete.size == 3 and jax.tree.leaves(concrete) == []


def test_unset_fields_with_defaults_are_filled_after_a_custom_init():
    class Net(fx.Module):
        width: int = fx.field(static=True, default=4)

        def __init__(self):
            pass

    assert Net().width == 4


def test_assigning_a_method_of_the_instance_in_init_is_refused():
    class Holder(fx.Module):
        fn: object

        def __init__(self):
            self.fn = self.helper

        def helper(self):
            return 1

    with pytest.raises(ValueError, match="Cannot assign methods in __init__"):
        Holder()


def test_abstract_class_var_resolved_by_a_field_with_a_default_is_refused():
    class Parent(fx.Module):
        name: fx.AbstractClassVar[str]

    with pytest.raises(TypeError, match="instance field that has a default"):

        class Child(Parent):
            name: str = "child"


def test_abstract_class_var_may_be_resolved_by_a_field_without_default():
    class Parent(fx.Module):
        name: fx.AbstractClassVar[str]

    with pytest.warns(fx.ClassVarFieldWarning):

        class Child(Parent):
            name: str

    assert Child("x").name == "x"


def test_jax_transformed_modules_assigned_as_fields_warn():
    class Layer(fx.Module):
        w: jax.Array

        def __call__(self, x):
            return self.w * x

    class Holder(fx.Module):
        fn: object

    with pytest.warns(UserWarning, match="JAX-transformed callable"):
        Holder(jax.jit(Layer(jnp.ones(2))))
    with pytest.warns(UserWarning, match="JAX-transformed callable"):
        Holder(jax.hessian(Layer(jnp.ones(2))))


def test_static_field_is_a_deprecated_alias():
    with pytest.warns(fx.FilteraxDeprecationWarning, match="deprecated"):

        class Legacy(fx.Module):
            size: int = fx.static_field(default=2)

    assert Legacy().size == 2 and jax.tree.leaves(Legacy()) == []


def test_abstract_attribute_bookkeeping_is_exposed():
    class Base(fx.Module):
        x: fx.AbstractVar[int]
        y: fx.AbstractClassVar[int]

    class Child(Base):
        x: int

    assert Base.__abstractvars__ == {"x"} and Base.__abstractclassvars__ == {"y"}
    assert Child.__abstractvars__ == frozenset()
    with pytest.raises(TypeError, match="unsubscripted"):

        class Bad(fx.Module):
            z: fx.AbstractVar

    with pytest.raises(TypeError, match="cannot have value"):

        class Valued(fx.Module):
            z: fx.AbstractVar[int] = 1


def test_a_restated_base_init_is_the_base_init_and_runs_once() -> None:
    calls = []

    class Base(fx.Module):
        size: int
        doubled: int

        def __init__(self, size: int):
            calls.append(size)
            self.size = size
            self.doubled = 2 * size

        def __check_init__(self) -> None:
            calls.append("checked")

    class Child(Base):
        __init__ = Base.__init__

    child = Child(3)
    assert (child.size, child.doubled) == (3, 6)
    assert calls == [3, "checked"]
    # The same user function, wrapped for each class's own fields.
    assert Child.__init__.__wrapped__ is Base.__init__.__wrapped__
    leaves, treedef = jax.tree_util.tree_flatten(child)
    assert jax.tree_util.tree_unflatten(treedef, leaves) == child


def test_a_class_with_an_init_var_unflattens_without_it():
    seen = []

    class Scaled(fx.Module):
        value: jax.Array
        factor: dataclasses.InitVar[float]
        offset: float = fx.field(init=False, default=0.5)

        def __post_init__(self, factor: float) -> None:
            seen.append(factor)
            self.value = self.value * factor

    model = Scaled(jnp.ones(2), 3.0)
    rebuilt = jtu.tree_map(lambda x: x + 1, model)
    assert seen == [3.0]  # the unflatten ran no __post_init__
    assert rebuilt.offset == 1.5 and (rebuilt.value == 4.0).all()
    with pytest.raises(TypeError, match="missing required argument: 'factor'"):
        Scaled(jnp.ones(2))


def test_generated_init_signature_shows_only_what_users_pass():
    class Checked(fx.Module):
        value: jax.Array
        factor: dataclasses.InitVar[float]
        kept: int = fx.field(init=False, default=1)

        def __post_init__(self, factor: float) -> None:
            pass

    assert list(inspect.signature(Checked).parameters) == ["value", "factor"]
    assert all(
        p.default is inspect.Parameter.empty
        for p in inspect.signature(Checked).parameters.values()
    )
    with pytest.raises(TypeError, match="unexpected keyword argument 'kept'"):
        Checked(jnp.ones(2), 1.0, kept=2)
    with pytest.raises(TypeError, match="unexpected keyword argument '__class__'"):
        Checked(jnp.ones(2), 1.0, __class__=int)


def test_generated_init_names_its_first_parameter_self():
    class Plain(fx.Module):
        x: int

    class OddField(fx.Module):
        self: int

    assert list(inspect.signature(Plain.__init__).parameters) == ["self", "x"]
    # A field named `self` keeps the hidden name free.
    assert list(inspect.signature(OddField.__init__).parameters)[1] == "self"
    assert OddField(self=3).self == 3


def test_custom_init_receives_field_named_keywords_it_takes():
    class Layer(fx.Module):
        weight: jax.Array
        bias: jax.Array

        def __init__(self, weight, *, scale=1.0, **extra):
            self.weight = weight * scale
            self.bias = jnp.asarray(sorted(extra))

    layer = Layer(weight=jnp.ones(2), scale=2.0)
    assert (layer.weight == 2.0).all() and layer.bias.shape == (0,)
    with pytest.raises(TypeError):
        Layer(jnp.ones(2), bias=jnp.ones(2), weight=jnp.ones(2))
    assert list(inspect.signature(Layer).parameters) == ["weight", "scale", "extra"]


def test_an_inherited_custom_init_fills_and_unflattens_a_subclass_s_own_fields():
    calls = []

    class Base(fx.Module):
        size: int

        def __init__(self, size):
            calls.append(size)
            self.size = size

    class Child(Base):
        extra: int = 7

    child = Child(2)
    assert (child.size, child.extra) == (2, 7)
    rebuilt = jtu.tree_map(lambda x: x * 10, child)
    assert (rebuilt.size, rebuilt.extra) == (20, 70) and calls == [2]
    assert type(rebuilt) is Child


@pytest.mark.parametrize("extra", ["plain", "checked", "custom", "post_init"])
def test_fields_named_like_builtins_or_self_construct_and_unflatten(extra: str) -> None:
    namespace: dict = {
        "__annotations__": {"type": str, "id": int, "self": float},
        "__module__": __name__,
    }
    if extra == "checked":
        namespace["__check_init__"] = lambda self: None
    elif extra == "post_init":
        namespace["__post_init__"] = lambda self: None
    elif extra == "custom":

        def __init__(module, kind):
            module.type, module.id, module.self = kind, 1, 2.0

        namespace["__init__"] = __init__
    cls = type(fx.Module)("Named", (fx.Module,), namespace)
    made = cls("relu") if extra == "custom" else cls("relu", 1, 2.0)
    assert (made.type, made.id, made.self) == ("relu", 1, 2.0)
    rebuilt = jtu.tree_map(lambda x: x, made)
    assert type(rebuilt) is cls and (rebuilt.type, rebuilt.id, rebuilt.self) == (
        "relu",
        1,
        2.0,
    )


@pytest.mark.parametrize("static", [False, True])
def test_unflatten_looks_through_no_function(static: bool, monkeypatch) -> None:
    # Issue 30: JAX's unflatten calls `__init__`; the transformed-function
    # check made when the Module was built is not redone.
    class Layer(fx.Module):
        weight: jax.Array
        activation: Any = fx.field(static=static, default=jax.nn.relu)
        other: Any = fx.field(static=static, default=lambda x: x)

    layers = [Layer(jnp.ones(2)) for _ in range(3)]
    calls: list[Any] = []
    monkeypatch.setattr(_construction, "wrapped_by_transform", calls.append)
    leaves, treedef = jax.tree.flatten(layers)
    rebuilt = jax.tree.unflatten(treedef, leaves)
    jax.tree.map(lambda x: x + 1 if fx.is_array(x) else x, layers)
    assert calls == []
    assert rebuilt[0].activation is jax.nn.relu
    Layer(jnp.ones(2), lambda x: 2 * x)  # a new function is checked
    assert len(calls) == 1
