"""Behaviour of `filterax.filter_jit`."""

from __future__ import annotations

import dataclasses
import gc
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest

import filterax as fx


class Counter:
    """Counts how many times a function body runs, i.e. how often it is traced."""

    def __init__(self) -> None:
        self.count = 0

    def tick(self) -> None:
        self.count += 1


class Linear(fx.Module):
    weight: jax.Array
    bias: jax.Array
    name: str = fx.field(static=True, default="linear")

    @fx.filter_jit
    def __call__(self, x):
        return self.weight @ x + self.bias

    @fx.filter_jit
    def scaled(self, x, factor):
        return factor * (self.weight @ x)

    def plain(self, x):
        return self.weight @ x


def make_linear(scale: float = 1.0) -> Linear:
    return Linear(scale * jnp.arange(6.0).reshape(2, 3), jnp.ones(2))


# --- Tracing and recompilation -----------------------------------------------------


def test_new_array_values_never_recompile():
    counter = Counter()

    @fx.filter_jit
    def f(x, y):
        counter.tick()
        return x + y

    for i in range(4):
        out = f(jnp.full(3, float(i)), jnp.ones(3))
        np.testing.assert_allclose(out, i + 1.0)
    assert counter.count == 1


def test_new_static_values_always_recompile():
    counter = Counter()

    @fx.filter_jit
    def f(x, power):
        counter.tick()
        return x**power

    x = jnp.arange(3.0)
    for power in (1, 2, 3, 2):
        np.testing.assert_allclose(f(x, power), np.arange(3.0) ** power)
    assert counter.count == 3


def test_new_shapes_and_dtypes_recompile():
    counter = Counter()

    @fx.filter_jit
    def f(x):
        counter.tick()
        return x * 2

    f(jnp.ones(3))
    f(jnp.ones(4))
    f(jnp.ones(3, dtype=jnp.int32))
    f(jnp.ones(3))
    assert counter.count == 3


def test_static_leaves_of_different_types_do_not_share_a_compilation():
    @fx.filter_jit
    def f(x, flag):
        return x, type(flag).__name__

    x = jnp.ones(2)
    assert f(x, 1)[1] == "int"
    assert f(x, 1.0)[1] == "float"
    assert f(x, True)[1] == "bool"


@pytest.mark.parametrize(
    "array_first",
    [
        lambda: jnp.asarray(1.0),  # weakly typed, like a Python float
        lambda: jnp.asarray(1),  # weakly typed, like a Python int
        lambda: jnp.array(True),  # 0-d bool, like a Python bool
        lambda: np.bool_(True),
        lambda: np.array(1.0, dtype=np.float32),
    ],
)
def test_python_scalars_stay_static_after_arrays_of_their_signature(array_first):
    # JAX gives Python scalars the signature of some 0-d arrays; a compilation
    # made for such an array must never be reused for a Python scalar.
    @fx.filter_jit
    def f(value):
        if isinstance(value, (bool, int, float)):
            return ("static", value)
        return ("traced", value)

    assert f(array_first())[0] == "traced"
    for scalar in (True, 2, 3.5, False, 7):
        assert f(scalar) == ("static", scalar)


def test_python_scalars_are_static_and_their_values_reach_python():
    @fx.filter_jit
    def f(x, n):
        # Python control flow on a static value.
        return x * n if n > 1 else -x

    np.testing.assert_allclose(f(jnp.ones(2), 3), 3.0)
    np.testing.assert_allclose(f(jnp.ones(2), 1), -1.0)


def test_numpy_arrays_and_scalars_are_traced():
    counter = Counter()

    @fx.filter_jit
    def f(x, s):
        counter.tick()
        assert isinstance(x, jax.core.Tracer) and isinstance(s, jax.core.Tracer)
        return x * s

    np.testing.assert_allclose(f(np.ones(3, np.float32), np.float32(2)), 2.0)
    np.testing.assert_allclose(f(np.full(3, 2, np.float32), np.float32(3)), 6.0)
    assert counter.count == 1


def test_key_arrays_are_traced_in_and_out():
    counter = Counter()

    @fx.filter_jit
    def split(key):
        counter.tick()
        return jax.random.split(key)

    keys = split(jax.random.key(0))
    assert fx.is_key_array(keys) and keys.shape == (2,)
    split(jax.random.key(1))
    assert counter.count == 1
    assert not jnp.array_equal(
        jax.random.key_data(split(jax.random.key(0))),
        jax.random.key_data(split(jax.random.key(1))),
    )


def test_non_differentiable_contents_are_traced():
    counter = Counter()

    @fx.filter_jit
    def f(frozen):
        counter.tick()
        return frozen.value * 2

    np.testing.assert_allclose(f(fx.NonDifferentiable(jnp.ones(2))), 2.0)
    np.testing.assert_allclose(f(fx.NonDifferentiable(jnp.zeros(2))), 0.0)
    assert counter.count == 1


def test_strings_and_functions_are_static_and_calls_keep_hitting_the_cache():
    counter = Counter()

    @fx.filter_jit
    def f(x, activation, label):
        counter.tick()
        return {"y": activation(x), "label": label}

    for i in range(3):
        out = f(jnp.full(2, float(i)), jnp.tanh, "tanh")
        np.testing.assert_allclose(out["y"], np.tanh(float(i)))
        assert out["label"] == "tanh"
    assert counter.count == 1
    f(jnp.ones(2), jnp.sin, "sin")
    assert counter.count == 2


# --- Outputs -------------------------------------------------------------------------


def test_non_array_outputs_are_the_python_objects_the_trace_produced():
    marker = object()

    @fx.filter_jit
    def f(x):
        return x + 1, "label", marker, None, {"n": 3, "fn": jnp.sin}

    arr, label, obj, nothing, info = f(jnp.ones(2))
    np.testing.assert_allclose(arr, 2.0)
    assert label == "label" and obj is marker and nothing is None
    assert info == {"n": 3, "fn": jnp.sin}
    # The same on a cache hit.
    assert f(jnp.zeros(2))[2] is marker


def test_unhashable_outputs_are_fine():
    @fx.filter_jit
    def f(x):
        return x, {"nested": {1, 2}}

    assert f(jnp.ones(1))[1] == {"nested": {1, 2}}


def test_module_outputs_are_rebuilt():
    @fx.filter_jit
    def double(model):
        return jax.tree.map(lambda a: 2 * a, model)

    model = make_linear()
    doubled = double(model)
    assert type(doubled) is Linear and doubled.name == "linear"
    np.testing.assert_allclose(doubled.weight, 2 * model.weight)


# --- Arguments -----------------------------------------------------------------------


def test_keyword_arguments_are_traced_or_static_like_positional_ones():
    counter = Counter()

    @fx.filter_jit
    def f(x, *, scale, mode="add"):
        counter.tick()
        return x * scale if mode == "mul" else x + scale

    np.testing.assert_allclose(f(jnp.ones(2), scale=jnp.full(2, 3.0)), 4.0)
    np.testing.assert_allclose(f(jnp.ones(2), scale=jnp.full(2, 5.0)), 6.0)
    assert counter.count == 1
    np.testing.assert_allclose(f(jnp.ones(2), scale=jnp.full(2, 3.0), mode="mul"), 3)
    assert counter.count == 2


def test_keyword_and_positional_structures_are_not_confused():
    @fx.filter_jit
    def f(*args, **kwargs):
        return len(args), sorted(kwargs)

    a, b = jnp.ones(1), jnp.zeros(1)
    assert f((a,), {"b": b}) == (2, [])
    assert f(a, b=b) == (1, ["b"])
    assert f((a,), {"b": b}) == (2, [])


def test_an_argument_named_self_or_fun_is_fine():
    @fx.filter_jit
    def f(self, fun):
        return self + fun

    np.testing.assert_allclose(f(self=jnp.ones(1), fun=jnp.ones(1)), 2.0)


def test_calls_without_arrays_work():
    @fx.filter_jit
    def f(n):
        return jnp.arange(n)

    np.testing.assert_array_equal(f(3), np.arange(3))


# --- Functions, methods, Modules -----------------------------------------------------


def test_decorator_factory_form():
    @fx.filter_jit(donate="none")
    def f(x):
        return x + 1

    np.testing.assert_allclose(f(jnp.zeros(2)), 1.0)


def test_wrapper_keeps_the_functions_name_and_doc():
    def documented(x):
        """Adds one."""
        return x + 1

    wrapped = fx.filter_jit(documented)
    assert wrapped.__name__ == "documented"
    assert wrapped.__doc__ == "Adds one."
    assert wrapped.__wrapped__ is documented


def test_method_decorated_in_the_class_body_traces_the_models_arrays():
    model = make_linear()
    x = jnp.ones(3)
    np.testing.assert_allclose(model(x), model.weight @ x + model.bias)
    np.testing.assert_allclose(model.scaled(x, 2.0), 2 * (model.weight @ x))
    # New parameter values reuse the compiled code.
    other = make_linear(3.0)
    np.testing.assert_allclose(other(x), other.weight @ x + other.bias)


def test_decorated_method_access_is_a_pytree_holding_the_model():
    model = make_linear()
    bound = model.scaled
    leaves = jax.tree.leaves(bound)
    assert len(leaves) == 2 and leaves[0] is model.weight


def test_decorated_method_accesses_compare_as_bound_methods_do():
    model = make_linear()
    assert model.scaled == model.scaled  # a new object on each access
    with pytest.raises(TypeError):
        hash(model.scaled)  # as `hash(model)`: its leaves are arrays
    assert model.scaled == make_linear().scaled  # equal models
    assert model.scaled != make_linear(3.0).scaled
    assert model.scaled != model.__call__


def test_decorated_method_recompiles_for_new_values_only_when_static():
    counter = Counter()

    class Scaler(fx.Module):
        factor: jax.Array
        mode: str = fx.field(static=True, default="mul")

        @fx.filter_jit
        def __call__(self, x):
            counter.tick()
            return self.factor * x if self.mode == "mul" else self.factor + x

    x = jnp.ones(2)
    Scaler(jnp.array(2.0))(x)
    Scaler(jnp.array(3.0))(x)
    assert counter.count == 1
    np.testing.assert_allclose(Scaler(jnp.array(3.0), "add")(x), 4.0)
    assert counter.count == 2


def test_filter_jit_of_a_bound_method_traces_the_model():
    model = make_linear()
    jitted = fx.filter_jit(model.plain)
    np.testing.assert_allclose(jitted(jnp.ones(3)), model.weight @ jnp.ones(3))


def test_filter_jit_of_a_callable_module():
    class Affine(fx.Module):
        weight: jax.Array

        def __call__(self, x):
            return self.weight * x

    counter = Counter()

    class Counted(fx.Module):
        weight: jax.Array

        def __call__(self, x):
            counter.tick()
            return self.weight * x

    model = fx.filter_jit(Counted(jnp.array(2.0)))
    np.testing.assert_allclose(model(jnp.ones(2)), 2.0)
    np.testing.assert_allclose(model(2 * jnp.ones(2)), 4.0)
    assert counter.count == 1
    np.testing.assert_allclose(fx.filter_jit(Affine(jnp.array(3.0)))(1.0), 3.0)


def test_module_arrays_inside_fun_are_traced_not_baked_in():
    class Holder(fx.Module):
        table: jax.Array

        def __call__(self, i):
            return self.table[i]

    jitted = fx.filter_jit(Holder(jnp.arange(5.0)))
    text = jitted.lower(2).as_text()
    # The table is an input of the computation, not a constant in it.
    assert "dense<[0.000000e+00, 1.000000e+00" not in text
    assert jitted(2) == 2.0


def test_works_on_registered_dataclasses():
    @jtu.register_dataclass
    @dataclasses.dataclass(frozen=True)
    class Params:
        w: jax.Array
        act: str = dataclasses.field(default="relu", metadata={"static": True})

    @fx.filter_jit
    def f(params, x):
        return params.w * x

    np.testing.assert_allclose(f(Params(jnp.ones(2)), 3.0), 3.0)


# --- Nesting -------------------------------------------------------------------------


def test_nested_call_becomes_part_of_the_enclosing_program():
    traces = []

    @fx.filter_jit
    def inner(x):
        traces.append(None)
        return jnp.sin(x)

    def outer(x):
        return inner(inner(x)) * 2

    jaxpr = jax.make_jaxpr(outer)(jnp.ones(2))
    primitives = [eqn.primitive.name for eqn in jaxpr.jaxpr.eqns]
    assert primitives == ["jit", "jit", "mul"]  # a call XLA inlines, not a dispatch
    assert len(traces) == 1  # the nested trace is cached, as for `jax.jit`
    np.testing.assert_allclose(jax.jit(outer)(jnp.ones(2)), 2 * np.sin(np.sin(1.0)))


def test_nested_call_after_a_top_level_call_gives_the_same_result():
    @fx.filter_jit
    def inner(x):
        return jnp.cos(x) + 1

    np.testing.assert_allclose(inner(jnp.zeros(2)), 2.0)
    out = jax.jit(lambda x: inner(x) * 3)(jnp.zeros(2))
    np.testing.assert_allclose(out, 6.0)
    grad = jax.grad(lambda x: inner(x).sum())(jnp.zeros(2))
    np.testing.assert_allclose(grad, 0.0, atol=1e-7)


def test_calls_of_arrays_keep_the_fast_path():
    # Implementation detail guarded here because dispatch speed depends on it:
    # all-array calls without Modules go to JAX as they are, without a static
    # key; calls passing Modules take the keyed route, where a Module is
    # flattened once and then found by identity.
    @fx.filter_jit
    def f(params, x, scale=1.0):
        return params["w"] @ x * scale

    params = {"w": jnp.eye(3)}
    for _ in range(3):
        f(params, np.ones(3, np.float32))
    assert f.compiled.direct_ok
    f(params, jnp.ones(3), 2.0)  # a Python scalar: now on the keyed path
    assert not f.compiled.direct_ok
    np.testing.assert_allclose(f(params, jnp.ones(3)), jnp.ones(3))

    @fx.filter_jit
    def g(model, x):
        return model(x)

    model = make_linear()
    g(model, jnp.ones(3))
    assert g.compiled.direct_ok is False
    key = g.compiled.last_call
    g(model, jnp.ones(3))
    assert g.compiled.last_call is key


def test_nested_calls_return_python_outputs_inside_a_trace():
    @fx.filter_jit
    def inner(x):
        return x + 1, "tag"

    @fx.filter_jit
    def outer(x):
        y, tag = inner(x)
        return y, tag + "!"

    out, tag = outer(jnp.ones(2))
    np.testing.assert_allclose(out, 2.0)
    assert tag == "tag!"


def test_works_under_grad_and_vmap():
    @fx.filter_jit
    def f(x, power):
        return jnp.sum(x**power)

    np.testing.assert_allclose(jax.grad(f)(jnp.ones(3), 2), 2.0)
    np.testing.assert_allclose(jax.vmap(f, in_axes=(0, None))(jnp.ones((4, 3)), 2), 3.0)


def test_filter_jit_made_inside_a_trace_of_a_closure_over_a_tracer():
    def outer(x):
        class Shift(fx.Module):
            amount: jax.Array

            def __call__(self, y):
                return y + self.amount

        return fx.filter_jit(Shift(x))(jnp.ones(2))

    np.testing.assert_allclose(jax.jit(outer)(jnp.array(2.0)), 3.0)


# --- Donation ------------------------------------------------------------------------


def _step(params, grads):
    return params - grads, 2 * grads


@pytest.mark.parametrize("donate", ["all", "warn"])
def test_donate_all_deletes_the_donated_buffers(donate):
    params, grads = jnp.ones(3), jnp.ones(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fx.filter_jit(_step, donate=donate)(params, grads)
    assert params.is_deleted() and grads.is_deleted()


@pytest.mark.parametrize("donate", ["all-except-first", "warn-except-first"])
def test_donate_except_first_keeps_the_first_argument(donate):
    params, grads = jnp.ones(3), jnp.ones(3)
    jitted = fx.filter_jit(lambda p, g: (p + 1, g * 2), donate=donate)
    jitted(params, grads)
    assert not params.is_deleted() and grads.is_deleted()


@pytest.mark.parametrize("donate", ["all-except-first", "warn-except-first"])
def test_donate_except_first_keeps_a_first_argument_passed_by_keyword(donate):
    def step(params, grads):
        return params + 1, grads * 2

    jitted = fx.filter_jit(step, donate=donate)
    params, grads = jnp.ones(3), jnp.ones(3)
    jitted(grads=grads, params=params)
    assert not params.is_deleted() and grads.is_deleted()
    params, grads = jnp.ones(3), jnp.ones(3)
    jitted.lower(params=params, grads=grads).compile()(grads=grads, params=params)
    assert not params.is_deleted() and grads.is_deleted()


def test_donate_except_first_with_a_static_leaf_first():
    params, grads = jnp.ones(3), jnp.ones(3)
    jitted = fx.filter_jit(lambda p, g: (p[0] + 1, g * 2), donate="all-except-first")
    jitted((params, "label"), grads)
    assert not params.is_deleted() and grads.is_deleted()


def test_donate_none_deletes_nothing():
    params, grads = jnp.ones(3), jnp.ones(3)
    fx.filter_jit(_step)(params, grads)
    assert not params.is_deleted() and not grads.is_deleted()


def test_arrays_inside_fun_are_donated_as_in_equinox():
    class Holder(fx.Module):
        table: jax.Array

        def __call__(self, x):
            return x + self.table, fx.tree_at(lambda h: h.table, self, self.table * 2)

    holder = Holder(jnp.ones(3))
    _, new = fx.filter_jit(holder, donate="all")(jnp.ones(3))
    assert holder.table.is_deleted()
    np.testing.assert_allclose(new.table, 2.0)
    kept = Holder(jnp.ones(3))
    fx.filter_jit(kept)(jnp.ones(3))
    assert not kept.table.is_deleted()


class _Scaler(fx.Module):
    weight: jax.Array

    def __call__(self, x, *rest):
        return self.weight * x


@pytest.mark.parametrize("extra", [(), ("tag",)])  # direct route, keyed route
def test_donate_all_consumes_the_argument_before_the_models_weights(extra):
    # One output, and both the argument and the weight could hold it: XLA
    # takes the first donated input of its shape, and filterax orders them as
    # Equinox does (first argument, function, other arguments), so the model
    # stays usable.
    model = _Scaler(jnp.ones(3))
    x = jnp.arange(3.0)
    fx.filter_jit(model, donate="all")(x, *extra)
    assert x.is_deleted() and not model.weight.is_deleted()
    # With the first argument kept, the function's arrays come next.
    x, y = jnp.arange(3.0), jnp.ones(3)
    fx.filter_jit(model, donate="all-except-first")(x, y, *extra)
    assert not x.is_deleted() and model.weight.is_deleted() and not y.is_deleted()


class _Shifter(fx.Module):
    shift: jax.Array

    def __call__(self, first, rest, label):
        # As many outputs of the inputs' shape as there are inputs, so that
        # every donated buffer can be used (and so is deleted).
        return first + self.shift, rest * 2 + self.shift, label, -self.shift


# (mode, whether the function's arrays and `rest` are donated, whether `first` is)
_KEYED_DONATION = [
    ("none", False, False),
    ("all", True, True),
    ("all-except-first", True, False),
]


@pytest.mark.parametrize(("donate", "rest_donated", "first_donated"), _KEYED_DONATION)
def test_keyed_calls_of_a_function_with_arrays_donate_per_mode(
    donate, rest_donated, first_donated
):
    # A static argument sends the call down the keyed route, where the
    # function's own arrays travel with the arguments' (one list, or apart when
    # donated).
    jitted = fx.filter_jit(_Shifter(jnp.ones(2)), donate=donate)
    first, rest = jnp.zeros(2), jnp.full(2, 3.0)
    out = jitted(first, rest, "tag")
    np.testing.assert_allclose(out[0], 1.0)
    np.testing.assert_allclose(out[1], 7.0)
    assert out[2] == "tag"
    assert jitted.fun.shift.is_deleted() is rest_donated
    assert rest.is_deleted() is rest_donated
    assert first.is_deleted() is first_donated


@pytest.mark.parametrize(("donate", "rest_donated", "first_donated"), _KEYED_DONATION)
def test_lowered_calls_of_a_function_with_arrays_match_calls(
    donate, rest_donated, first_donated
):
    jitted = fx.filter_jit(_Shifter(jnp.ones(2)), donate=donate)
    compiled = jitted.lower(jnp.zeros(2), jnp.zeros(2), "tag").compile()
    first, rest = jnp.zeros(2), jnp.full(2, 3.0)
    out = compiled(first, rest, "tag")
    np.testing.assert_allclose(out[1], 7.0)
    assert out[2] == "tag"
    assert rest.is_deleted() is rest_donated
    assert first.is_deleted() is first_donated


def _unusable_donation(x, y):
    # `y` has no output of its shape to be reused for.
    return x + y.sum()


@pytest.mark.parametrize("donate", ["all", "all-except-first"])
def test_silent_donation_modes_hide_the_unusable_buffer_warning(donate):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fx.filter_jit(_unusable_donation, donate=donate)(jnp.ones(3), jnp.ones(5))
    assert not [w for w in caught if "donated buffers" in str(w.message)]


@pytest.mark.parametrize("donate", ["warn", "warn-except-first"])
def test_warn_donation_modes_show_the_unusable_buffer_warning(donate):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fx.filter_jit(_unusable_donation, donate=donate)(jnp.ones(3), jnp.ones(5))
    assert [w for w in caught if "donated buffers" in str(w.message)]


def test_silencing_does_not_leak_into_later_code():
    fx.filter_jit(_unusable_donation, donate="all")(jnp.ones(3), jnp.ones(5))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jax.jit(_unusable_donation, donate_argnums=(0, 1))(jnp.ones(4), jnp.ones(6))
    assert [w for w in caught if "donated buffers" in str(w.message)]


def test_unknown_donate_mode_is_an_error():
    with pytest.raises(ValueError, match="donate='some'"):
        fx.filter_jit(_step, donate="some")


# --- lower ---------------------------------------------------------------------------


def test_lower_gives_jax_lowered_text_and_costs():
    jitted = fx.filter_jit(lambda x, n: x**n)
    lowered = jitted.lower(jnp.ones(3), 2)
    assert "stablehlo" in lowered.as_text()
    assert lowered.cost_analysis()["flops"] > 0


def test_compiled_call_takes_the_original_arguments():
    jitted = fx.filter_jit(lambda x, n, label: {"y": x**n, "label": label})
    compiled = jitted.lower(jnp.ones(3), 2, "sq").compile()
    out = compiled(jnp.full(3, 3.0), 2, "sq")
    assert out["label"] == "sq"
    np.testing.assert_allclose(out["y"], 9.0)
    assert "flops" in compiled.cost_analysis()


def test_compiled_call_with_other_static_values_names_the_difference():
    compiled = fx.filter_jit(lambda x, n: x**n).lower(jnp.ones(3), 2).compile()
    with pytest.raises(ValueError, match=r"at \(args, kwargs\)\[0\]\[1\]: 2 vs 3"):
        compiled(jnp.ones(3), 3)
    with pytest.raises(ValueError, match=r"f32\[3\] vs f32\[4\]"):
        compiled(jnp.ones(4), 2)


def test_compile_accepts_compiler_options():
    lowered = fx.filter_jit(lambda x: 2 * x).lower(jnp.ones(2))
    compiled = lowered.compile(compiler_options={"xla_embed_ir_in_executable": False})
    np.testing.assert_allclose(compiled(jnp.ones(2)), 2.0)


def test_lower_of_a_decorated_method():
    model = make_linear()
    lowered = model.scaled.lower(jnp.ones(3), 2.0)
    # Called as the method is: without the instance it was lowered for.
    np.testing.assert_allclose(
        lowered.compile()(jnp.full(3, 2.0), 2.0), model.scaled(jnp.full(3, 2.0), 2.0)
    )


def test_lower_rejects_unhashable_static_leaves_by_path():
    jitted = fx.filter_jit(lambda x, opts: x)
    with pytest.raises(TypeError, match=r"args\[1\]\['opts'\]"):
        jitted.lower(jnp.ones(1), {"opts": {1, 2}})


# --- Errors --------------------------------------------------------------------------


def test_unhashable_static_leaf_names_its_key_path():
    jitted = fx.filter_jit(lambda x, config: x)
    with pytest.raises(TypeError, match=r"args\[1\]\['opts'\].*unhashable set"):
        jitted(jnp.ones(1), {"opts": {1, 2}})


def test_unhashable_static_leaf_error_is_also_the_value_error_equinox_raises():
    jitted = fx.filter_jit(lambda x, config: x)
    with pytest.raises(ValueError, match="unhashable set"):
        jitted(jnp.ones(1), {1, 2})


def test_unhashable_static_keyword_names_its_key_path():
    jitted = fx.filter_jit(lambda x, **kwargs: x)
    with pytest.raises(TypeError, match=r"kwargs\['config'\]\[0\]"):
        jitted(jnp.ones(1), config=[{3}])


def test_errors_raised_by_the_function_propagate_unchanged():
    counter = Counter()

    @fx.filter_jit
    def f(x):
        counter.tick()
        raise TypeError("from the user")

    with pytest.raises(TypeError, match="from the user"):
        f(jnp.ones(2))
    assert counter.count == 1


def test_errors_on_the_keyed_path_are_not_chained_to_the_direct_attempt():
    @fx.filter_jit
    def f(x, label):
        raise ValueError("bad " + label)

    with pytest.raises(ValueError, match="bad label") as info:
        f(jnp.ones(2), "label")
    assert info.value.__context__ is None


def test_not_callable_is_an_error():
    with pytest.raises(TypeError, match="expected a callable"):
        fx.filter_jit(3)


# --- Caches --------------------------------------------------------------------------


def test_rewrapping_the_same_function_reuses_its_compilation():
    counter = Counter()

    def f(x):
        counter.tick()
        return x + 1

    for _ in range(3):
        fx.filter_jit(f)(jnp.ones(2))
    assert counter.count == 1


def test_dropping_the_function_frees_it_and_its_compiled_code():
    def make():
        def f(x):
            return x * 2

        jitted = fx.filter_jit(f)
        jitted(jnp.ones(2))
        return weakref.ref(f), weakref.ref(jitted.compiled.direct)

    function_ref, compiled_ref = make()
    gc.collect()
    assert function_ref() is None
    assert compiled_ref() is None


def test_dropping_a_module_fun_frees_it():
    class Holder(fx.Module):
        table: jax.Array

        def __call__(self, x):
            return x + self.table

    def make():
        holder = Holder(jnp.ones(2))
        fx.filter_jit(holder)(jnp.ones(2))
        return weakref.ref(holder)

    holder_ref = make()
    gc.collect()
    assert holder_ref() is None


def test_concurrent_callers_of_an_all_array_function_get_right_answers():
    @fx.filter_jit
    def f(x, y):
        return x * 2 + y

    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def worker(seed: int) -> None:
        try:
            barrier.wait()  # compile from several threads at once
            for i in range(20):
                value = float(seed * 100 + i)
                shape = (seed % 2 + 1,)
                out = f(jnp.full(shape, value), jnp.ones(shape))
                np.testing.assert_allclose(out, 2 * value + 1)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors


def test_concurrent_callers_get_right_answers():
    counter = Counter()

    @fx.filter_jit
    def f(x, offset):
        counter.tick()
        return x * 2 + offset

    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            for i in range(20):
                value = float(seed * 100 + i)
                out = f(jnp.full(3, value), seed % 3)
                np.testing.assert_allclose(out, 2 * value + seed % 3)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    # One compilation per static value, however the threads interleaved.
    assert counter.count <= 3 + 3


def test_clear_caches_forces_a_new_trace():
    counter = Counter()

    @fx.filter_jit
    def f(x, label):
        counter.tick()
        return x

    f(jnp.ones(2), "a")
    fx.clear_caches()
    f(jnp.ones(2), "a")
    assert counter.count == 2


def test_keyed_calls_notice_an_array_position_turning_static():
    traces = []

    @fx.filter_jit
    def scale(fn, x):
        traces.append(type(x))
        return fn(x) * 2

    assert scale(jnp.negative, jnp.array(1.0)) == -2.0
    assert scale(jnp.negative, jnp.array(3.0)) == -6.0  # same key, reused
    assert scale(jnp.negative, 2.0) == -4.0  # same treedef, now a static leaf
    assert scale(jnp.negative, 5.0) == -10.0
    assert traces[0] is not float and traces[1:] == [float, float]


# --- One trace per compilation, in every route ----------------------------------------


def _counting(fun):
    traces = []

    def counted(*args, **kwargs):
        traces.append(None)
        return fun(*args, **kwargs)

    return counted, traces


def test_one_trace_per_compilation_on_the_direct_route():
    f, traces = _counting(lambda x: x + 1)
    jitted = fx.filter_jit(f)
    for _ in range(3):
        jitted(jnp.ones(2))
    assert len(traces) == 1 and jitted.compiled.direct_ok


def test_one_trace_per_compilation_when_falling_back_to_the_keyed_route():
    f, traces = _counting(lambda x, n: x * n)
    jitted = fx.filter_jit(f)
    jitted(jnp.ones(2), 2)  # a Python scalar: leaves the direct trace early
    jitted(jnp.ones(2), 2)
    assert len(traces) == 1 and not jitted.compiled.direct_ok
    jitted(jnp.ones(2), 3)
    assert len(traces) == 2


class _ConvertsToArray:
    """Not an array, though JAX could make one of it: a static argument."""

    def __jax_array__(self) -> jax.Array:
        return jnp.ones(3)

    def __hash__(self) -> int:
        return 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ConvertsToArray)


def test_an_object_with_jax_array_is_a_static_argument():
    # JAX refuses such an object as an argument (a ValueError, before
    # tracing); filterax hashes it like any other non-array leaf.
    f, traces = _counting(lambda x, converts: (x * 2, converts))
    jitted = fx.filter_jit(f)
    for _ in range(2):
        doubled, converts = jitted(jnp.ones(2), _ConvertsToArray())
        assert type(converts) is _ConvertsToArray
        np.testing.assert_allclose(doubled, 2.0)
    assert len(traces) == 1 and jitted.compiled.direct_ok is False


def test_one_trace_per_compilation_with_a_non_array_leaf():
    f, traces = _counting(lambda x, label: x)
    jitted = fx.filter_jit(f)
    jitted(jnp.ones(2), "a")
    jitted(jnp.ones(2), "a")
    assert len(traces) == 1


def test_one_trace_per_compilation_when_nested_in_other_transforms():
    f, traces = _counting(lambda x: jnp.sin(x) * 2)
    jitted = fx.filter_jit(f)
    grad = jax.grad(lambda x: jitted(x).sum())
    grad(jnp.ones(2))
    grad(jnp.ones(2))
    jax.vmap(jitted)(jnp.ones((3, 2)))
    jax.vmap(jitted)(jnp.ones((3, 2)))
    assert len(traces) == 1  # JAX batches and differentiates the cached trace


def test_wrappers_of_modules_with_one_structure_share_their_compilation():
    class Affine(fx.Module):
        w: jax.Array
        act: object

        def __call__(self, x):
            return self.act(self.w * x)

    traces = []

    def act(y):
        traces.append(None)
        return jnp.tanh(y)

    for value in (1.0, 2.0, 3.0):
        out = fx.filter_jit(Affine(jnp.full(2, value), act))(jnp.ones(2))
        np.testing.assert_allclose(out, np.tanh(value))
    assert len(traces) == 1


def test_a_copy_made_by_unflattening_shares_the_compiled_code():
    jitted = fx.filter_jit(make_linear())
    jitted(jnp.ones(3))
    leaves, treedef = jax.tree_util.tree_flatten(jitted)
    copy = jax.tree_util.tree_unflatten(treedef, [leaf * 2 for leaf in leaves])
    assert copy.compiled is jitted.compiled
    np.testing.assert_allclose(copy(jnp.ones(3)), 2 * jitted(jnp.ones(3)))


class _Activated(fx.Module):
    weight: jax.Array
    bias: jax.Array | None
    activation: Callable

    def __call__(self, x, label="keyed"):
        out = x * self.weight
        return self.activation(out if self.bias is None else out + self.bias), label


@pytest.mark.parametrize("label", [(), ("keyed",)], ids=["direct", "keyed"])
def test_a_copy_holding_another_function_runs_that_function(label):
    # Regression: the copy kept the original's compiled code, so it ran the old
    # activation silently.
    jitted = fx.filter_jit(_Activated(jnp.ones(2), jnp.zeros(2), jax.nn.relu))
    x = -jnp.ones(2)
    np.testing.assert_allclose(jitted(x, *label)[0], 0.0)
    tanh = fx.tree_at(lambda j: j.fun.activation, jitted, jnp.tanh)
    assert tanh.compiled is not jitted.compiled
    np.testing.assert_allclose(tanh(x, *label)[0], jnp.tanh(-1.0), rtol=1e-6)
    np.testing.assert_allclose(jitted(x, *label)[0], 0.0)


@pytest.mark.parametrize("label", [(), ("keyed",)], ids=["direct", "keyed"])
def test_a_copy_holding_fewer_arrays_runs_with_them(label):
    # Regression: the copy fed its arguments' arrays to the original's slots.
    jitted = fx.filter_jit(_Activated(jnp.full(2, 2.0), jnp.ones(2), lambda y: y))
    no_bias = fx.tree_at(lambda j: j.fun.bias, jitted, None)
    np.testing.assert_allclose(no_bias(jnp.full(2, 5.0), *label)[0], 10.0)
    np.testing.assert_allclose(jitted(jnp.full(2, 5.0), *label)[0], 11.0)


def test_a_copy_holding_another_plain_function_runs_it():
    jitted = fx.filter_jit(jnp.sin)
    cosine = fx.tree_at(lambda j: j.fun, jitted, jnp.cos)
    np.testing.assert_allclose(cosine(jnp.zeros(2)), 1.0)
    np.testing.assert_allclose(jitted(jnp.zeros(2)), 0.0)
    plain = fx.filter_jit(lambda x: x + 1)
    assert jtu.tree_map(lambda f: f, plain).compiled is plain.compiled


# --- Refs -------------------------------------------------------------------------------


class RefCounter(fx.Module):
    count: Any
    step: jax.Array

    def __call__(self, x):
        self.count[...] = self.count[...] + self.step
        return x * self.count[...]


def test_a_ref_is_traced_and_its_writes_are_visible_after_the_call():
    traces = []

    @fx.filter_jit
    def run(counter, x):
        traces.append(None)
        return counter(x)

    counter = RefCounter(jax.new_ref(jnp.zeros(())), jnp.ones(()))
    np.testing.assert_allclose(run(counter, jnp.ones(2)), 1.0)
    np.testing.assert_allclose(run(counter, jnp.ones(2)), 2.0)
    assert float(counter.count[...]) == 2.0
    other = RefCounter(jax.new_ref(jnp.full((), 10.0, jnp.float32)), jnp.ones(()))
    np.testing.assert_allclose(run(other, jnp.ones(2)), 11.0)
    assert len(traces) == 1  # another Ref of the same shape and dtype: no retrace


def test_a_module_holding_refs_comes_back_with_the_very_same_refs():
    @fx.filter_jit
    def touch(counter, label):
        counter(1.0)
        return counter, label

    counter = RefCounter(jax.new_ref(jnp.zeros(())), jnp.ones(()))
    for route_label in ("keyed", "keyed"):
        out, label = touch(counter, route_label)
        assert out.count is counter.count and label == route_label
    direct = fx.filter_jit(lambda c: (c(1.0), c)[1])
    out = direct(counter)
    assert out.count is counter.count
    assert float(counter.count[...]) == 3.0


def test_returning_a_ref_made_inside_is_a_clear_error():
    with pytest.raises(ValueError, match="only return the Refs it was given"):
        fx.filter_jit(lambda x: jax.new_ref(x))(jnp.ones(2))


def test_refs_in_a_lowered_call_are_mapped_back():
    counter = RefCounter(jax.new_ref(jnp.zeros(())), jnp.ones(()))
    jitted = fx.filter_jit(lambda c: (c(1.0), c)[1])
    compiled = jitted.lower(counter).compile()
    out = compiled(counter)
    assert out.count is counter.count and float(counter.count[...]) == 1.0


def test_a_program_that_fails_while_running_is_not_run_again():
    runs = []

    def record(x):
        runs.append(1)
        return x

    @fx.filter_jit
    def checked(x):
        x = jax.pure_callback(record, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        return fx.error_if(x, x > 0, "positive")

    checked(jnp.array([-1.0]))
    runs.clear()
    with pytest.raises(fx.FilteraxRuntimeError, match="positive"):
        checked(jnp.array([1.0]))
    assert len(runs) == 1
    # The failure did not switch the function off JAX's own dispatch.
    assert checked.compiled.direct_ok
    assert checked(jnp.array([-2.0])).tolist() == [-2.0]
    assert len(runs) == 2


class _Slow(fx.Module):
    weight: jax.Array
    activation: Any


@pytest.mark.parametrize("route", ["keyed", "direct"])
def test_calls_return_before_the_device_finishes(route: str) -> None:
    # Each call depends on the last, so the device needs ~100x one call's time;
    # a blocking dispatch would leave the last output ready when the loop ends.
    @fx.filter_jit
    def keyed(model: _Slow, x: jax.Array) -> jax.Array:
        for _ in range(6):
            x = model.activation(model.weight @ x)
        return x

    @fx.filter_jit
    def direct(weight: jax.Array, x: jax.Array) -> jax.Array:
        for _ in range(6):
            x = jnp.tanh(weight @ x)
        return x

    weight = jnp.eye(400) * 0.5
    x = jnp.ones((400, 400))
    if route == "keyed":
        model = _Slow(weight, jnp.tanh)
        step = lambda x: keyed(model, x)  # noqa: E731
    else:
        step = lambda x: direct(weight, x)  # noqa: E731
    step(x).block_until_ready()
    for _ in range(100):
        x = step(x)
    assert not x.is_ready()
    x.block_until_ready()


def test_a_compiled_call_with_a_shape_dtype_struct_argument_accepts_it_again():
    struct = jax.ShapeDtypeStruct((3,), jnp.float32)  # a static (non-array) leaf
    compiled = fx.filter_jit(lambda x, s: x + 1).lower(jnp.ones(3), struct).compile()
    assert jnp.array_equal(compiled(jnp.ones(3), struct), jnp.full(3, 2.0))


def test_a_jax_transform_of_a_module_warns_that_its_arrays_are_constants():
    model = fx.nn.Linear(2, 2, key=jax.random.key(0))
    with pytest.warns(UserWarning, match="of a Linear: the transformed function"):
        jitted = fx.filter_jit(jax.vmap(model))
    assert jitted(jnp.ones((3, 2))).shape == (3, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fx.filter_jit(jax.vmap(lambda x: x))
        fx.filter_jit(fx.filter_vmap(model))
        fx.filter_jit(jax.vmap(fx.nn.Identity()))  # no arrays to hide


@pytest.mark.filterwarnings("ignore:A JAX array is being set as static")
def test_a_static_array_field_does_not_break_later_calls_on_its_class():
    # Its static part cannot be compared with `==`: such parts are told
    # apart rather than raising, here and in JAX's cache.
    class Config(fx.Module):
        weight: jax.Array
        setting: Any = fx.field(static=True)

    results = []
    for setting in (jnp.ones(2), (1, 2), (1, 2)):

        @fx.filter_jit
        def double(module):
            return module.weight * 2

        results.append(double(Config(jnp.ones(2), setting)))
    for result in results:
        np.testing.assert_array_equal(result, jnp.full(2, 2.0))


def test_a_module_argument_traces_once_outside_and_under_grad_and_vmap():
    # Tracers and concrete arrays describe a call alike: `jax.jit`'s cache
    # (and its own rules for the outer transform) serve the call under `grad`
    # or `vmap` from the one trace, as in Equinox.
    traces = []

    class Scale(fx.Module):
        weight: jax.Array

    @fx.filter_jit
    def apply(module, x):
        traces.append(None)
        return module.weight * x

    module, x = Scale(jnp.ones(3)), jnp.arange(3.0)
    apply(module, x)
    np.testing.assert_array_equal(
        jax.grad(lambda x: apply(module, x).sum())(x), jnp.ones(3)
    )
    gradient = jax.grad(lambda w: apply(Scale(w), x).sum())(jnp.ones(3))
    np.testing.assert_array_equal(gradient, x)
    assert len(traces) == 1
    jax.vmap(lambda w: apply(Scale(w), x))(jnp.ones((2, 3)))
    assert len(traces) == 1


def test_a_static_argument_whose_eq_raises_is_named_by_its_key_path():
    class Incomparable:
        def __hash__(self) -> int:
            return 0

        def __eq__(self, other: object) -> bool:
            raise ValueError("cannot compare")

    add_one = fx.filter_jit(lambda x, static: x + 1)
    with pytest.raises(TypeError, match=r"args\[1\] is a static Incomparable whose"):
        add_one(jnp.ones(2), Incomparable())
        add_one(jnp.ones(2), Incomparable())


def test_a_call_sent_to_the_keyed_route_keeps_its_donated_arrays() -> None:
    # The direct trace that hands a Python scalar to the keyed route uses none
    # of its inputs, so JAX prunes them and donates nothing before the keyed
    # call runs.
    scale = fx.filter_jit(lambda x, y: x * y, donate="all")
    scale(jnp.ones(3), jnp.ones(3))
    x = jnp.full(3, 2.0)
    assert scale(x, 3.0).tolist() == [6.0, 6.0, 6.0]
    assert scale.compiled.direct_ok is False
    assert scale(jnp.full(3, 2.0), 4.0).tolist() == [8.0, 8.0, 8.0]
