"""`filter_custom_jvp` and `filter_custom_vjp`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx

# ---------------------------------------------------------------------------
# filter_custom_jvp


def _make_custom_jvp(seen: list) -> Any:
    @fx.filter_custom_jvp
    def scale(params, factor, *, label="scale"):
        return {"y": params["w"] * factor, "n": params["n"], "label": label}

    @scale.def_jvp
    def _(primals, tangents, *, label="scale"):
        seen.append(tangents)
        params, factor = primals
        t_params, t_factor = tangents
        out = scale(params, factor, label=label)
        t_y = None if t_params["w"] is None else 10 * t_params["w"] * factor
        if t_factor is not None:
            t_y = (
                params["w"] * t_factor if t_y is None else t_y + params["w"] * t_factor
            )
        return out, {"y": t_y, "n": None, "label": None}

    return scale


def _jvp_params() -> dict:
    return {
        "w": jnp.array([1.0, 2.0]),
        "n": jnp.array(3),
        "frozen": fx.NonDifferentiable(jnp.ones(2)),
        "act": "relu",
    }


def test_custom_jvp_primal_call_runs_the_function():
    scale = _make_custom_jvp([])
    out = scale(_jvp_params(), 2.0, label="hello")
    assert out["label"] == "hello" and out["n"] == 3
    assert jnp.array_equal(out["y"], jnp.array([2.0, 4.0]))


def test_custom_jvp_rule_is_used_and_gets_none_for_non_differentiable_inputs():
    seen: list = []
    scale = _make_custom_jvp(seen)
    grad = fx.filter_grad(lambda p: scale(p, 2.0)["y"].sum())(_jvp_params())
    assert jnp.array_equal(grad["w"], jnp.full(2, 20.0))
    assert grad["n"] is None and grad["frozen"] is None and grad["act"] is None
    t_params, t_factor = seen[-1]
    assert t_params["n"] is None and t_params["frozen"] is None
    assert t_params["act"] is None and t_factor is None


def test_custom_jvp_symbolic_zero_tangents_arrive_as_none():
    seen: list = []
    scale = _make_custom_jvp(seen)
    factor = jnp.array(2.0, jnp.float32)
    _, t_out = fx.filter_jvp(
        lambda p, f: scale(p, f), (_jvp_params(), factor), (None, jnp.ones(()))
    )
    t_params, t_factor = seen[-1]
    assert t_params["w"] is None and t_factor is not None
    assert jnp.array_equal(t_out["y"], jnp.array([1.0, 2.0]))
    assert t_out["n"] is None and t_out["label"] is None


def test_custom_jvp_none_output_tangent_means_zero():
    @fx.filter_custom_jvp
    def f(x):
        return {"a": x * 2, "b": x * 3}

    f.def_jvp(lambda primals, tangents: (f(*primals), {"a": tangents[0], "b": None}))
    _, t_out = fx.filter_jvp(f, (jnp.ones(2),), (jnp.ones(2),))
    assert jnp.array_equal(t_out["a"], jnp.ones(2))
    assert t_out["b"] is None


def test_custom_jvp_wrong_output_tangent_names_path():
    @fx.filter_custom_jvp
    def f(x):
        return {"a": x * 2, "n": jnp.arange(2)}

    f.def_jvp(lambda primals, tangents: (f(*primals), {"a": jnp.ones(3), "n": None}))
    with pytest.raises(ValueError, match=r"t_out\['a'\].*expected shape \(2,\)"):
        fx.filter_jvp(f, (jnp.ones(2),), (jnp.ones(2),))
    f.def_jvp(lambda primals, tangents: (f(*primals), {"a": None, "n": jnp.ones(2)}))
    with pytest.raises(ValueError, match=r"t_out\['n'\].*None, a SymbolicZero"):
        fx.filter_jvp(f, (jnp.ones(2),), (jnp.ones(2),))


def test_custom_jvp_keyword_arguments_are_never_differentiated():
    @fx.filter_custom_jvp
    def f(x, *, scale):
        return x * scale

    f.def_jvp(lambda primals, tangents, *, scale: (f(*primals, scale=scale), None))
    with pytest.raises(ValueError, match=r"kwargs\['scale'\] is being differentiated"):
        fx.filter_grad(lambda s: f(jnp.ones(()), scale=s))(jnp.ones(()))


def test_custom_jvp_needs_a_rule():
    f = fx.filter_custom_jvp(lambda x: x)
    with pytest.raises(RuntimeError, match="def_jvp"):
        f(jnp.ones(2))


def test_custom_jvp_under_jit_and_vmap():
    scale = _make_custom_jvp([])

    @fx.filter_jit
    def grads(ws):
        def loss(w):
            return scale({"w": w, "n": jnp.array(1)}, 2.0)["y"].sum()

        return jax.vmap(fx.filter_grad(loss))(ws)

    assert jnp.array_equal(grads(jnp.ones((3, 2))), jnp.full((3, 2), 20.0))


# ---------------------------------------------------------------------------
# filter_custom_vjp


def _make_custom_vjp(log: dict) -> Any:
    @fx.filter_custom_vjp
    def apply(params, x, *, mode="mul"):
        return {"y": params["w"] * x, "z": params["b"] * 2, "n": params["n"], "m": mode}

    @apply.def_fwd
    def _(perturbed, params, x, *, mode="mul"):
        log["perturbed"] = perturbed
        return apply(params, x, mode=mode), {"x": x, "mode": mode}

    @apply.def_bwd
    def _(residuals, grad_obj, perturbed, params, x, *, mode="mul"):
        log["grad_obj"] = grad_obj
        log["residuals"] = residuals
        g_w = None if grad_obj["y"] is None else grad_obj["y"] * residuals["x"] * 10
        return {"w": g_w, "b": None, "n": None, "frozen": None}

    return apply


def _vjp_params() -> dict:
    return {
        "w": jnp.array([1.0, 2.0]),
        "b": jnp.array(1.0, jnp.float32),
        "n": jnp.array(3),
        "frozen": fx.NonDifferentiable(jnp.ones(2)),
    }


def test_custom_vjp_primal_call_runs_the_function():
    apply = _make_custom_vjp({})
    out = apply(_vjp_params(), 3.0, mode="m")
    assert out["m"] == "m" and jnp.array_equal(out["y"], jnp.array([3.0, 6.0]))


def test_custom_vjp_rule_is_used_with_perturbed_flags():
    log: dict = {}
    apply = _make_custom_vjp(log)
    grad = fx.filter_grad(lambda p: apply(p, 3.0)["y"].sum())(_vjp_params())
    assert jnp.array_equal(grad["w"], jnp.full(2, 30.0))
    assert jnp.array_equal(grad["b"], jnp.zeros(()))
    assert grad["n"] is None and grad["frozen"] is None
    perturbed = log["perturbed"]
    assert perturbed["w"] is True and perturbed["b"] is True
    assert perturbed["n"] is False and perturbed["frozen"].value is False
    assert log["residuals"] == {"x": 3.0, "mode": "mul"}


def test_custom_vjp_grad_obj_is_none_for_zero_and_non_differentiable_outputs():
    log: dict = {}
    apply = _make_custom_vjp(log)
    _, vjp_fn = fx.filter_vjp(lambda p: apply(p, 3.0), _vjp_params())
    vjp_fn({"y": jnp.ones(2), "z": None, "n": None, "m": None})
    grad_obj = log["grad_obj"]
    assert grad_obj["z"] is None and grad_obj["n"] is None and grad_obj["m"] is None
    assert jnp.array_equal(grad_obj["y"], jnp.ones(2))


def test_custom_vjp_unperturbed_leaves_are_flagged_false():
    log: dict = {}
    apply = _make_custom_vjp(log)
    params = _vjp_params()
    fx.filter_grad(lambda w: apply({**params, "w": w}, 3.0)["y"].sum())(params["w"])
    assert log["perturbed"]["w"] is True and log["perturbed"]["b"] is False


def test_custom_vjp_differentiated_extra_argument_names_path():
    apply = _make_custom_vjp({})
    with pytest.raises(ValueError, match=r"args\[0\] of `fn\(vjp_arg"):
        fx.filter_grad(lambda x: apply(_vjp_params(), x)["y"].sum())(jnp.ones(2))
    with pytest.raises(ValueError, match=r"kwargs\['scale'\]\['s'\]"):
        fx.filter_grad(lambda s: _make_scaled()(jnp.ones(2), scale={"s": s}).sum())(
            jnp.ones(())
        )


def _make_scaled() -> Any:
    @fx.filter_custom_vjp
    def scaled(x, *, scale):
        return x * scale["s"]

    scaled.def_fwd(lambda perturbed, x, *, scale: (scaled(x, scale=scale), None))
    scaled.def_bwd(lambda res, g, perturbed, x, *, scale: g * scale["s"])
    return scaled


def test_custom_vjp_non_differentiable_arguments_never_receive_cotangents():
    params = {"w": jnp.ones(2), "frozen": fx.NonDifferentiable(jnp.ones(2))}

    @fx.filter_custom_vjp
    def f(p):
        return (p["w"] * p["frozen"]._value).sum()

    f.def_fwd(lambda perturbed, p: (f(p), None))
    f.def_bwd(lambda res, g, perturbed, p: {"w": g * jnp.full(2, 2.0), "frozen": None})
    grad = fx.filter_grad(f)(params)
    assert grad["frozen"] is None and jnp.array_equal(grad["w"], jnp.full(2, 2.0))


def test_custom_vjp_bwd_values_at_non_differentiable_leaves_are_ignored():
    # As in Equinox: a rule that builds its cotangent from `vjp_arg` (keeping
    # its string, or a zero for its integer buffer) is accepted, and those
    # leaves get no gradient.
    @fx.filter_custom_vjp
    def f(p):
        return (p["w"] * p["n"]).sum()

    f.def_fwd(lambda perturbed, p: (f(p), None))
    f.def_bwd(
        lambda res, g, perturbed, p: fx.tree_at(
            lambda q: (q["w"], q["n"]),
            p,
            (jnp.full(2, g * p["n"]), jnp.zeros((), jnp.int32)),
        )
    )
    grad = fx.filter_grad(f)({"w": jnp.ones(2), "n": jnp.array(2), "tag": "x"})
    assert grad["n"] is None and grad["tag"] is None
    np.testing.assert_array_equal(grad["w"], jnp.full(2, 2.0))


def test_custom_vjp_bwd_numpy_float64_cotangent_is_taken_as_float32():
    @fx.filter_custom_vjp
    def f(w):
        return w * 2

    f.def_fwd(lambda perturbed, w: (f(w), None))
    f.def_bwd(lambda res, g, perturbed, w: np.full(2, 2.0))
    grad = jax.grad(lambda w: f(w).sum())(jnp.ones(2))
    assert grad.dtype == jnp.float32
    np.testing.assert_array_equal(grad, np.full(2, 2.0))


def test_custom_vjp_bwd_wrong_shape_names_path():
    @fx.filter_custom_vjp
    def f(p):
        return p["w"].sum()

    f.def_fwd(lambda perturbed, p: (f(p), None))
    f.def_bwd(lambda res, g, perturbed, p: {"w": jnp.ones(3)})
    with pytest.raises(ValueError, match=r"grad_vjp_arg\['w'\].*expected shape \(2,\)"):
        fx.filter_grad(f)({"w": jnp.ones(2)})


def test_custom_vjp_bwd_may_return_none_for_everything():
    @fx.filter_custom_vjp
    def f(p):
        return p["w"].sum()

    f.def_fwd(lambda perturbed, p: (f(p), None))
    f.def_bwd(lambda res, g, perturbed, p: None)
    assert jnp.array_equal(fx.filter_grad(f)({"w": jnp.ones(2)})["w"], jnp.zeros(2))


def test_custom_vjp_needs_both_rules():
    f = fx.filter_custom_vjp(lambda x: x)
    f.def_fwd(lambda perturbed, x: (x, None))
    with pytest.raises(RuntimeError, match="def_bwd"):
        f(jnp.ones(2))


def test_custom_vjp_inside_jit_and_scan():
    apply = _make_custom_vjp({})

    def step(w, x):
        params = {**_vjp_params(), "w": w}
        grad = fx.filter_grad(lambda p: apply(p, x)["y"].sum())(params)
        return w - 0.01 * grad["w"], grad["w"]

    _, grads = fx.filter_jit(lambda w, xs: jax.lax.scan(step, w, xs))(
        jnp.ones(2), jnp.ones(4)
    )
    assert jnp.array_equal(grads, jnp.full((4, 2), 10.0))


def test_deprecated_defvjp_warns_and_registers_rules_without_perturbed():
    @fx.filter_custom_vjp
    def scaled(x, factor):
        return x * factor

    def forward(x, factor):
        return x * factor, factor

    def backward(residual, grad_out, x, factor):
        return 10 * residual * grad_out  # deliberately not the true derivative

    with pytest.warns(fx.FilteraxDeprecationWarning, match="def_fwd"):
        scaled.defvjp(forward, backward)
    grad = fx.filter_grad(lambda x: scaled(x, 3.0).sum())(jnp.ones(2))
    assert jnp.array_equal(grad, jnp.full(2, 30.0))


def test_deprecated_defvjp_rule_gets_zeros_for_unused_outputs():
    # The older rule form never saw None at an inexact array (as in Equinox).
    seen = []

    @fx.filter_custom_vjp
    def pair(x):
        return x * 2, {"tripled": x * 3, "tag": "t"}

    def backward(residual, grad_out, x):
        first, rest = grad_out
        seen.append(rest)
        return 2 * first + 3 * rest["tripled"]

    with pytest.warns(fx.FilteraxDeprecationWarning):
        pair.defvjp(lambda x: (pair.fn(x), None), backward)
    grad = fx.filter_grad(lambda x: pair(x)[0].sum())(jnp.ones(2))
    assert jnp.array_equal(grad, jnp.full(2, 2.0))
    assert jnp.array_equal(seen[0]["tripled"], jnp.zeros(2))
    assert seen[0]["tag"] is None


def test_deprecated_defjvp_rule_gets_zeros_and_defjvps_is_refused():
    seen = []

    @fx.filter_custom_jvp
    def add(x, y, n):
        return x + y * n

    def rule(primals, tangents):
        seen.append(tangents)
        x, y, n = primals
        tx, ty, _ = tangents
        return add(x, y, n), tx + ty * n

    with pytest.warns(fx.FilteraxDeprecationWarning, match="def_jvp"):
        add.defjvp(rule)
    _, t_out = fx.filter_jvp(
        add, (jnp.ones(2), jnp.ones(2), 3), (None, jnp.ones(2), None)
    )
    assert jnp.array_equal(t_out, jnp.full(2, 3.0))
    tx, ty, tn = seen[0]
    assert jnp.array_equal(tx, jnp.zeros(2)) and tn is None
    with pytest.raises(NotImplementedError, match="def_jvp"):
        add.defjvps(None)


def test_calling_before_the_rule_is_registered_is_an_error_of_both_types():
    unready = fx.filter_custom_jvp(lambda x: x)
    with pytest.raises(RuntimeError, match="before its rule"):
        unready(jnp.ones(2))
    with pytest.raises(AttributeError):  # as Equinox (through jax.custom_jvp)
        unready(jnp.ones(2))


def test_custom_jvp_python_scalars_stay_python_values_under_jit():
    # As in Equinox: a Python float argument is static, so the function and
    # its rule may branch on it, and it gets no tangent.
    seen = []

    @fx.filter_custom_jvp
    def scaled(x, scale):
        seen.append(type(scale))
        return x * scale if scale > 2 else x

    @scaled.def_jvp
    def _(primals, tangents):
        x, scale = primals
        assert tangents[1] is None
        return scaled(x, scale), tangents[0] * scale

    assert float(jax.jit(lambda x: scaled(x, 3.0))(jnp.array(1.0))) == 3.0
    gradient = fx.filter_jit(jax.grad(lambda x: scaled(x, 3.0)))(jnp.array(1.0))
    assert float(gradient) == 3.0
    assert set(seen) == {float}


def test_custom_vjp_bwd_of_the_wrong_structure_is_also_a_runtime_error():
    # Equinox raises RuntimeError here; filterax's error is a ValueError too.
    @fx.filter_custom_vjp
    def f(p):
        return p["w"].sum()

    f.def_fwd(lambda perturbed, p: (f(p), None))
    f.def_bwd(lambda res, g, perturbed, p: [g * jnp.ones(2)])
    with pytest.raises(RuntimeError, match=r"grad_vjp_arg") as info:
        fx.filter_grad(f)({"w": jnp.ones(2)})
    assert isinstance(info.value, ValueError)


def test_custom_vjp_vjp_arg_may_hold_none():
    # An optional part of `vjp_arg`, or a layer without bias: `None` is an
    # empty subtree, and the gradient has `None` there.
    linear = fx.nn.Linear(2, 2, use_bias=False, key=jax.random.key(0))

    @fx.filter_custom_vjp
    def apply(model, x):
        return model(x)

    apply.def_fwd(lambda perturbed, model, x: (model(x), None))
    apply.def_bwd(
        lambda res, g, perturbed, model, x: fx.tree_at(
            lambda m: m.weight, model, jnp.outer(g, x)
        )
    )
    x = jnp.array([1.0, 2.0])
    grad = fx.filter_grad(lambda m: apply(m, x).sum())(linear)
    assert grad.bias is None
    np.testing.assert_array_equal(grad.weight, jnp.outer(jnp.ones(2), x))

    @fx.filter_custom_vjp
    def scaled(pair, y):
        return pair[0] * y

    scaled.def_fwd(lambda perturbed, pair, y: (scaled(pair, y), None))
    scaled.def_bwd(lambda res, g, perturbed, pair, y: (g * y, None))
    y = jnp.array([1.0, 4.0])
    gradient = jax.grad(lambda x: scaled((x, None), y).sum())(jnp.ones(2))
    np.testing.assert_array_equal(gradient, y)
