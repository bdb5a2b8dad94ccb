"""`filter_scan`: the carry rule, slicing `xs`, static outputs, Refs, scan
over layers, checkpoints, and what it costs (equations, traces, FLOPs)."""

from __future__ import annotations

from functools import cache, partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx


def _running_sum(carry, x):
    total, label = carry
    return (total + x, label), {"partial": total + x, "label": label}


def test_static_leaves_pass_through_and_come_back_as_python_values():
    (total, label), ys = fx.filter_scan(
        _running_sum, (jnp.array(0.0), "sum"), jnp.arange(4.0)
    )
    assert label == "sum" and ys["label"] == "sum"
    assert float(total) == 6.0
    np.testing.assert_array_equal(ys["partial"], [0.0, 1.0, 3.0, 6.0])


def test_matches_lax_scan_forwards_and_in_reverse():
    xs = jnp.arange(5.0)

    def step(c, x):
        return c * 0.5 + x, c

    for reverse in (False, True):
        expected = jax.lax.scan(step, jnp.array(1.0), xs, reverse=reverse)
        got = fx.filter_scan(step, jnp.array(1.0), xs, reverse=reverse, unroll=2)
        np.testing.assert_allclose(got[0], expected[0])
        np.testing.assert_allclose(got[1], expected[1])


def test_non_array_leaves_of_xs_reach_every_step_whole():
    xs = {"scale": 3, "values": jnp.arange(3.0)}
    _, ys = fx.filter_scan(lambda c, x: (c, x["values"] * x["scale"]), None, xs)
    np.testing.assert_array_equal(ys, [0.0, 3.0, 6.0])


def test_length_without_xs():
    carry, ys = fx.filter_scan(lambda c, _: (c + 1, c), jnp.array(0), length=3)
    assert int(carry) == 3
    np.testing.assert_array_equal(ys, [0, 1, 2])


def test_key_arrays_are_traced_and_sliced():
    keys = jax.random.split(jax.random.key(0), 3)
    _, draws = fx.filter_scan(lambda c, k: (c, jax.random.normal(k)), None, keys)
    expected = jnp.stack([jax.random.normal(k) for k in keys])
    np.testing.assert_array_equal(draws, expected)


def test_changed_static_leaf_names_the_carry_path_and_both_values():
    with pytest.raises(TypeError, match=r"carry\['mode'\]: 'a' vs 'b'"):
        fx.filter_scan(
            lambda c, _: ({"x": c["x"], "mode": "b"}, None),
            {"x": jnp.zeros(2), "mode": "a"},
            length=2,
        )


def test_changed_shape_names_the_carry_path_and_both_shapes():
    with pytest.raises(TypeError, match=r"carry\[0\]\.h: f32\[3\] vs f32\[\]"):

        class State(fx.Module):
            h: jax.Array

        fx.filter_scan(
            lambda c, _: ((State(c[0].h.sum()),), None),
            (State(jnp.zeros(3)),),
            length=2,
        )


def test_changed_dtype_is_an_error():
    with pytest.raises(TypeError, match=r"carry: i32\[\] vs (weak_)?f32\[\]"):
        fx.filter_scan(lambda c, _: (c * 1.5, None), jnp.ones((), jnp.int32), length=2)


def test_python_number_in_carry_is_static_and_the_error_says_so():
    with pytest.raises(TypeError, match=r"carry\[1\].*make it an array"):
        fx.filter_scan(
            lambda c, _: ((c[0], c[1] + jnp.ones(())), None),
            (jnp.ones(()), 0),
            length=2,
        )


def test_structure_change_is_an_error():
    with pytest.raises(
        TypeError, match=r"carry: a tuple of length 2 vs a tuple of length 1"
    ):
        fx.filter_scan(
            lambda c, _: ((c[0],), None), (jnp.ones(()), jnp.ones(())), length=1
        )


def test_xs_arrays_of_different_lengths_name_both_leaves():
    with pytest.raises(
        ValueError,
        match=r"xs\['a'\] has length 2 \(f32\[2\]\) and xs\['b'\] has length 3",
    ):
        fx.filter_scan(
            lambda c, x: (c, None), None, {"a": jnp.zeros(2), "b": jnp.zeros(3)}
        )


def test_length_disagreeing_with_xs_is_an_error():
    with pytest.raises(ValueError, match=r"length=4, but xs\[0\] has length 3"):
        fx.filter_scan(lambda c, x: (c, None), None, [jnp.zeros(3)], length=4)


def test_scalar_array_in_xs_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"xs\['s'\] is a scalar array"):
        fx.filter_scan(lambda c, x: (c, None), None, {"s": jnp.zeros(())})


def test_no_xs_and_no_length_is_an_error():
    with pytest.raises(ValueError, match="pass `length`"):
        fx.filter_scan(lambda c, x: (c, None), jnp.zeros(()))


def test_body_must_return_a_pair():
    with pytest.raises(TypeError, match=r"must return a pair"):
        fx.filter_scan(lambda c, x: c, jnp.zeros(()), length=1)


# --- Refs ----------------------------------------------------------------------


def test_ref_in_carry_is_shared_and_comes_back_as_the_same_object():
    ref = jax.new_ref(jnp.zeros(()))

    def step(carry, x):
        carry["acc"][...] += x
        return carry, None

    carry, _ = fx.filter_scan(step, {"acc": ref}, jnp.arange(4.0))
    assert carry["acc"] is ref
    assert float(ref[...]) == 6.0


def test_returning_another_ref_is_an_error():
    ref = jax.new_ref(jnp.zeros(()))
    with pytest.raises(TypeError, match=r"carry\['r'\]: Ref\(f32\[\]\) vs another Ref"):
        fx.filter_scan(
            lambda c, _: ({"r": jax.new_ref(jnp.ones(()))}, None), {"r": ref}, length=1
        )


def test_returning_an_array_in_place_of_a_ref_is_an_error():
    ref = jax.new_ref(jnp.zeros(()))
    with pytest.raises(TypeError, match=r"carry: Ref\(f32\[\]\) vs f32\[\]"):
        fx.filter_scan(lambda c, _: (c[...], None), ref, length=1)


def test_ref_in_xs_reaches_every_step_whole():
    ref = jax.new_ref(jnp.zeros(2))

    def step(c, x):
        x["ref"][...] += x["v"]
        return c, None

    fx.filter_scan(step, None, {"ref": ref, "v": jnp.ones((3, 2))})
    np.testing.assert_array_equal(ref[...], [3.0, 3.0])


def _draws_unrolled(steps: int) -> jax.Array:
    stream = fx.RngStream(7)
    return jnp.stack([jax.random.normal(stream(), (2,)) for _ in range(steps)])


def test_rng_stream_advances_as_if_unrolled():
    stream = fx.RngStream(7)
    _, draws = fx.filter_scan(
        lambda s, _: (s, jax.random.normal(s(), (2,))), stream, length=4
    )
    np.testing.assert_array_equal(draws, _draws_unrolled(4))
    assert int(stream.count[...]) == 4


def test_rng_stream_advances_inside_filter_jit():
    stream = fx.RngStream(7)

    @fx.filter_jit
    def draw(stream):
        return fx.filter_scan(
            lambda s, _: (s, jax.random.normal(s(), (2,))), stream, length=4
        )

    out_stream, draws = draw(stream)
    np.testing.assert_array_equal(draws, _draws_unrolled(4))
    assert out_stream.count is stream.count and int(stream.count[...]) == 4


def test_rng_stream_under_filter_grad_gives_the_unrolled_gradient():
    def loss(w, stream, unrolled):
        if unrolled:
            x = jnp.ones(2)
            for _ in range(3):
                x = x * w + jax.random.normal(stream(), (2,))
            return x.sum()
        (_, x), _ = fx.filter_scan(
            lambda c, _: ((c[0], c[1] * w + jax.random.normal(c[0](), (2,))), None),
            (stream, jnp.ones(2)),
            length=3,
        )
        return x.sum()

    expected = fx.filter_grad(loss)(jnp.array(0.5), fx.RngStream(1), True)
    stream = fx.RngStream(1)
    got = fx.filter_grad(loss)(jnp.array(0.5), stream, False)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert int(stream.count[...]) == 3


# --- Differentiation -----------------------------------------------------------


def test_non_differentiable_contents_are_traced_and_get_none_gradients():
    def loss(params):
        def step(c, _):
            return c * params["w"] + params["frozen"].value, None

        carry, _ = fx.filter_scan(step, jnp.ones(2), length=3)
        return carry.sum()

    params = {"w": jnp.array(0.5), "frozen": fx.NonDifferentiable(jnp.ones(2))}
    grads = fx.filter_grad(loss)(params)
    assert grads["frozen"] is None or grads["frozen"].value is None
    # c3 = w^3 + (w^2 + w + 1) * frozen, summed over 2 entries
    np.testing.assert_allclose(grads["w"], 2 * (3 * 0.25 + 2 * 0.5 + 1), rtol=1e-6)


def _rnn_loss(w, xs, checkpoints=None):
    def step(h, x):
        h = jnp.tanh(w @ h + x)
        return h, (h**2).sum()

    h, ys = fx.filter_scan(step, jnp.ones(3), xs, checkpoints=checkpoints)
    return h.sum() + ys.sum()


@pytest.mark.parametrize("checkpoints", [1, 3, 10])
@pytest.mark.parametrize("reverse", [False, True])
def test_checkpoints_give_the_same_values_and_gradients(checkpoints, reverse):
    w = jnp.eye(3) * 0.6 + 0.1
    xs = jnp.linspace(-1.0, 1.0, 30).reshape(10, 3)

    def loss(w, checkpoints):
        def step(h, x):
            h = jnp.tanh(w @ h + x)
            return h, h[0]

        h, ys = fx.filter_scan(
            step, jnp.ones(3), xs, reverse=reverse, checkpoints=checkpoints
        )
        return h.sum() + (ys * jnp.arange(10.0)).sum()

    value_and_grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    value, grad = value_and_grad(w, checkpoints)
    expected_value, expected_grad = value_and_grad(w, None)
    np.testing.assert_allclose(value, expected_value, rtol=1e-6)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-6)


def test_checkpoints_bound_what_reverse_mode_stores():
    size, length = 512, 400
    xs = jnp.zeros((length, size))

    def temp_carries(checkpoints):
        def loss(w):
            def step(h, x):
                return jnp.sin(h * w + x), None

            h, _ = fx.filter_scan(step, jnp.ones(size), xs, checkpoints=checkpoints)
            return h.sum()

        compiled = jax.jit(jax.grad(loss)).lower(0.5).compile()
        return compiled.memory_analysis().temp_size_in_bytes / (4 * size)

    stored_all, stored_sqrt = temp_carries(None), temp_carries(20)
    assert stored_all > length
    assert stored_sqrt < 5 * 20  # about 20 carries + 20 steps of one segment


def test_checkpoints_must_be_a_positive_int():
    with pytest.raises(ValueError, match="at least 1"):
        fx.filter_scan(lambda c, x: (c, None), None, length=2, checkpoints=0)
    with pytest.raises(TypeError, match="must be an int"):
        fx.filter_scan(lambda c, x: (c, None), None, length=2, checkpoints=2.0)


def test_ref_writes_with_checkpoints_run_but_refuse_derivatives():
    # Recomputing steps would repeat the writes. Run forward, the scan is
    # stored whole and matches `checkpoints=None`, the Ref's state too; any
    # derivative raises rather than recompute.
    def make(checkpoints):
        counter = jax.new_ref(jnp.zeros(()))

        def loss(w):
            def step(h, x):
                counter[...] += x
                return h * w + counter[...], None

            return fx.filter_scan(
                step, jnp.array(1.0), jnp.arange(1.0, 7.0), checkpoints=checkpoints
            )[0]

        return loss, counter

    for run in (lambda loss: loss(0.5), lambda loss: fx.filter_jit(loss)(0.5)):
        (loss, counter), (reference, reference_counter) = make(2), make(None)
        np.testing.assert_allclose(run(loss), run(reference))
        np.testing.assert_allclose(counter[...], reference_counter[...])
    loss, counter = make(2)
    for differentiate in (
        lambda: jax.grad(loss)(0.5),
        lambda: fx.filter_jit(jax.grad(loss))(0.5),
        lambda: jax.jvp(loss, (0.5,), (1.0,)),
    ):
        with pytest.raises(
            TypeError, match=r"cannot be differentiated when the body writes a Ref"
        ):
            differentiate()
    assert counter[...] == 0  # nothing ran halfway
    jax.grad(make(None)[0])(0.5)  # without checkpoints, nothing is recomputed


# --- Costs ---------------------------------------------------------------------


def _equations(fn, *args) -> int:
    return len(jax.make_jaxpr(fn)(*args).jaxpr.eqns)


def test_forward_pass_is_the_same_jaxpr_as_lax_scan():
    def step(c, x):
        return jnp.tanh(c * x["w"] + x["b"]), c

    xs = {"w": jnp.ones((5, 3)), "b": jnp.zeros((5, 3))}
    ours = jax.make_jaxpr(lambda c, xs: fx.filter_scan(step, c, xs))(jnp.ones(3), xs)
    theirs = jax.make_jaxpr(lambda c, xs: jax.lax.scan(step, c, xs))(jnp.ones(3), xs)
    assert str(ours) == str(theirs)


def test_body_is_traced_once():
    traces = []

    def step(c, x):
        traces.append(None)
        return c + x, None

    fx.filter_scan(step, jnp.zeros(2), jnp.ones((4, 2)))
    assert len(traces) == 1
    traces.clear()
    fx.filter_scan(step, jnp.zeros(2), jnp.ones((4, 2)), checkpoints=2)
    assert len(traces) == 1


class Affine(fx.Module):
    weight: jax.Array
    bias: jax.Array
    activation: str = fx.field(static=True)

    def __init__(self, scale: jax.Array):
        self.weight = jnp.eye(4) * scale
        self.bias = jnp.ones(4) * scale
        self.activation = "relu"

    def __call__(self, x: jax.Array) -> jax.Array:
        return getattr(jax.nn, self.activation)(self.weight @ x + self.bias)


@cache
def _stacked_layers(depth: int) -> Affine:
    """`depth` layers stacked by `filter_vmap` of the constructor."""
    return fx.filter_vmap(Affine)(jnp.linspace(-1.0, 1.0, depth))


def _through_layers(layers: Affine, x: jax.Array) -> jax.Array:
    return fx.filter_scan(lambda h, layer: (layer(h), None), x, layers)[0]


def test_scan_over_layers_matches_applying_each_layer():
    layers = _stacked_layers(3)
    x = jnp.arange(4.0)
    expected = x
    for scale in jnp.linspace(-1.0, 1.0, 3):
        expected = Affine(scale)(expected)
    np.testing.assert_allclose(_through_layers(layers, x), expected, rtol=1e-6)


def test_scan_over_layers_jaxpr_does_not_grow_with_depth():
    x = jnp.ones(4)
    shallow = fx.filter_make_jaxpr(_through_layers)(_stacked_layers(2), x)[0]
    deep = fx.filter_make_jaxpr(_through_layers)(_stacked_layers(64), x)[0]
    assert len(shallow.eqns) == len(deep.eqns)
    [shallow_scan] = [e for e in shallow.eqns if e.primitive.name == "scan"]
    [deep_scan] = [e for e in deep.eqns if e.primitive.name == "scan"]
    assert (shallow_scan.params["length"], deep_scan.params["length"]) == (2, 64)
    assert str(shallow_scan.params["jaxpr"]) == str(deep_scan.params["jaxpr"])


def test_scan_over_layers_traces_the_layer_once():
    calls = []

    class Counted(fx.Module):
        inner: Affine

        def __call__(self, x):
            calls.append(None)
            return self.inner(x)

    layers = Counted(_stacked_layers(16))
    fx.filter_scan(lambda h, layer: (layer(h), None), jnp.ones(4), layers)
    assert len(calls) == 1


def _flops(fn, *args) -> float:
    return jax.jit(fn).lower(*args).compile().cost_analysis()["flops"]


def _vjp_flops(fn, cotangent, w, xs) -> float:
    def pull_back(w, xs):
        _, vjp_fn = fx.filter_vjp(fn, w, xs)
        return vjp_fn(cotangent)

    return jax.jit(pull_back).lower(w, xs).compile().cost_analysis()["flops"]


def _rnn(w, xs, checkpoints=None):
    def step(h, x):
        h = jnp.tanh(w @ h + x)
        return h, {"expensive": (w @ w) @ h, "cheap": h[0]}

    return fx.filter_scan(step, jnp.ones(16), xs, checkpoints=checkpoints)


_W, _XS = jnp.full((16, 16), 0.01), jnp.ones((12, 16))


@pytest.mark.parametrize("checkpoints", [None, 4])
def test_no_cotangent_for_ys_costs_what_the_carry_alone_costs(checkpoints):
    run = partial(_rnn, checkpoints=checkpoints)
    with_none = _vjp_flops(run, (jnp.ones(16), None), _W, _XS)
    carry_only = _vjp_flops(lambda w, xs: run(w, xs)[0], jnp.ones(16), _W, _XS)
    assert with_none <= carry_only


def test_partial_cotangent_for_ys_costs_what_the_live_outputs_cost():
    ct = (jnp.ones(16), {"expensive": None, "cheap": jnp.ones(12)})
    partial_ct = _vjp_flops(_rnn, ct, _W, _XS)

    def live_outputs(w, xs):
        carry, ys = _rnn(w, xs)
        return carry, ys["cheap"]

    live = _vjp_flops(live_outputs, (jnp.ones(16), jnp.ones(12)), _W, _XS)
    full = _vjp_flops(
        _rnn,
        (jnp.ones(16), {"expensive": jnp.ones((12, 16)), "cheap": jnp.ones(12)}),
        _W,
        _XS,
    )
    assert partial_ct < full
    assert partial_ct <= live


# --- Nesting -------------------------------------------------------------------


def test_inside_filter_jit_filter_vmap_and_filter_grad():
    def final(w, x0):
        def step(c, x):
            return {"h": jnp.sin(c["h"] * w + x), "name": c["name"]}, None

        carry, _ = fx.filter_scan(step, {"h": x0, "name": "h"}, jnp.arange(3.0))
        return carry["h"]

    x0s = jnp.array([0.1, 0.2, 0.3])
    batched = fx.filter_jit(fx.filter_vmap(final, in_axes=(None, 0)))(0.5, x0s)
    expected = jnp.stack([final(0.5, x) for x in x0s])
    np.testing.assert_allclose(batched, expected, rtol=1e-6)
    grad = fx.filter_jit(fx.filter_grad(lambda w: final(w, x0s).sum()))(jnp.array(0.5))
    eps = 1e-3
    numeric = (final(0.5 + eps, x0s).sum() - final(0.5 - eps, x0s).sum()) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=1e-2)


def test_nested_in_other_control_flow():
    def inner(c, x):
        return c + x, None

    def outer(c, x):
        c = fx.filter_cond(x > 1, lambda c: c * 2, lambda c: c, c)
        c, _ = fx.filter_scan(inner, c, jnp.full(2, x))
        return c, c

    carry, ys = fx.filter_scan(outer, jnp.array(0.0), jnp.arange(3.0))
    # x=0: 0; x=1: 0 + 2 = 2; x=2: 2*2 + 4 = 8
    np.testing.assert_allclose(ys, [0.0, 2.0, 8.0])
