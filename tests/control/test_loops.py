"""`filter_while_loop` (`kind="lax"`, `"bounded"`, `"checkpointed"`) and
`filter_fori_loop`: the carry rule, reverse mode of each kind, Refs, memory
and recomputation of the checkpointed loop, nesting."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx


def _halve(state):
    x, steps, name = state
    return x / 2, steps + 1, name


def test_while_loop_carries_static_leaves():
    x, steps, name = fx.filter_while_loop(
        lambda s: s[0] > 1, _halve, (jnp.array(20.0), jnp.array(0), "x")
    )
    assert (float(x), int(steps), name) == (0.625, 5, "x")


@pytest.mark.parametrize("kind", ["lax", "bounded", "checkpointed"])
def test_max_steps_caps_the_number_of_steps(kind):
    x, steps, _ = fx.filter_while_loop(
        lambda s: s[0] > 1,
        _halve,
        (jnp.array(20.0), jnp.array(0), "x"),
        kind=kind,
        max_steps=3,
    )
    assert (float(x), int(steps)) == (2.5, 3)


def test_body_changing_the_carry_names_the_path():
    with pytest.raises(
        TypeError,
        match=r"filter_while_loop: the carry changed at carry\['x'\]: f32\[2\] vs f32\[\]",
    ):
        fx.filter_while_loop(
            lambda s: s["x"].sum() > 0,
            lambda s: {"x": s["x"].sum()},
            {"x": jnp.ones(2)},
        )


def test_condition_must_be_a_boolean_scalar():
    with pytest.raises(
        TypeError, match=r"`cond_fun` must return a boolean scalar; got f32\[2\]"
    ):
        fx.filter_while_loop(lambda s: s, lambda s: s, jnp.ones(2))


def test_argument_errors():
    with pytest.raises(ValueError, match="kind must be one of"):
        fx.filter_while_loop(lambda s: s < 1, lambda s: s, jnp.array(0), kind="scan")
    with pytest.raises(ValueError, match='kind="bounded" needs `max_steps`'):
        fx.filter_while_loop(lambda s: s < 1, lambda s: s, jnp.array(0), kind="bounded")
    with pytest.raises(
        ValueError, match='`checkpoints` is for kind="checkpointed" only'
    ):
        fx.filter_while_loop(
            lambda s: s < 1,
            lambda s: s,
            jnp.array(0),
            kind="bounded",
            max_steps=2,
            checkpoints=4,
        )
    with pytest.raises(ValueError, match="`checkpoints` must be at least 1"):
        fx.filter_while_loop(
            lambda s: s < 1,
            lambda s: s,
            jnp.array(0),
            kind="checkpointed",
            checkpoints=0,
        )


# --- Reverse mode ----------------------------------------------------------------


def _step(w, x):
    return jnp.sin(x * w) + 0.1 * x


def _loop_loss(w, x0, kind, *, unknown_steps, **options):
    """`x -> sin(x w) + x / 10`, either a known number of times (7) or until
    the first entry exceeds 0.35: each example of `x0` takes its own count."""

    def cond(state):
        x, i = state
        if unknown_steps:
            return (x[0] < 0.35) & (i < 50)
        return i < 7

    def body(state):
        x, i = state
        return _step(w, x), i + 1

    x, _ = fx.filter_while_loop(cond, body, (x0, jnp.array(0)), kind=kind, **options)
    return (x**2).sum()


def _steps_taken(w, x0, unknown_steps) -> int:
    if not unknown_steps:
        return 7
    x, steps = np.asarray(x0), 0
    while x[0] < 0.35 and steps < 50:
        x, steps = np.asarray(_step(w, x)), steps + 1
    return steps


def _unrolled_loss(w, x0, steps):
    x = x0
    for _ in range(steps):
        x = _step(w, x)
    return (x**2).sum()


@pytest.mark.parametrize("unknown_steps", [False, True])
@pytest.mark.parametrize(
    "kind, options",
    [
        ("bounded", {"max_steps": 60}),
        ("checkpointed", {}),
        ("checkpointed", {"checkpoints": 1}),
        ("checkpointed", {"checkpoints": 3}),
    ],
)
def test_reverse_mode_gradients_equal_the_unrolled_loop(kind, options, unknown_steps):
    w, x0 = jnp.array(0.9), jnp.array([0.05, -0.3, 0.6])
    steps = _steps_taken(w, x0, unknown_steps)
    expected = jax.grad(_unrolled_loss, (0, 1))(w, x0, steps)
    loss = partial(_loop_loss, kind=kind, unknown_steps=unknown_steps, **options)
    got = jax.jit(jax.grad(loss, (0, 1)))(w, x0)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def test_checkpointed_respects_max_steps_in_reverse_mode():
    w, x0 = jnp.array(0.9), jnp.array([0.05, -0.3, 0.6])

    def capped(w, x0):
        x = x0
        for _ in range(4):
            x = _step(w, x)
        return (x**2).sum()

    loss = partial(_loop_loss, kind="checkpointed", unknown_steps=False, max_steps=4)
    np.testing.assert_allclose(
        jax.grad(loss)(w, x0), jax.grad(capped)(w, x0), rtol=1e-5
    )


def test_lax_kind_is_differentiable_in_forward_mode():
    w, x0 = jnp.array(0.9), jnp.array([0.05, -0.3, 0.6])
    loss = partial(_loop_loss, x0=x0, kind="lax", unknown_steps=True)
    expected = partial(_unrolled_loss, x0=x0, steps=_steps_taken(w, x0, True))
    got = jax.jvp(loss, (w,), (jnp.array(1.0),))
    want = jax.jvp(expected, (w,), (jnp.array(1.0),))
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_lax_kind_forward_mode_under_vmap():
    """`jacfwd` is `vmap` of `jvp`: the batched tangents take the
    `custom_vmap` path of the reverse-mode guard."""
    x0 = jnp.array([0.05, -0.3, 0.6])

    def final(w):
        def body(state):
            x, i = state
            return _step(w, x), i + 1

        x, _ = fx.filter_while_loop(lambda s: s[1] < 5, body, (x0 * w, jnp.array(0)))
        return x

    def unrolled(w):
        x = x0 * w
        for _ in range(5):
            x = _step(w, x)
        return x

    ws = jnp.array([[0.9], [1.1]])
    np.testing.assert_allclose(
        jax.jacfwd(final)(ws[0, 0]), jax.jacfwd(unrolled)(ws[0, 0]), rtol=1e-5
    )
    np.testing.assert_allclose(
        fx.filter_vmap(jax.jacfwd(lambda w: final(w[0])))(ws),
        jax.vmap(jax.jacfwd(lambda w: unrolled(w[0])))(ws),
        rtol=1e-5,
    )


_LAX_MESSAGE = (
    r'reverse-mode differentiation \(grad, vjp\) of a loop with kind="lax" is not '
    r'supported.*`max_steps=...` with kind="bounded".*kind="checkpointed"'
)


@pytest.mark.parametrize(
    "differentiate",
    [
        lambda loss: jax.grad(loss)(jnp.array(0.9)),
        lambda loss: jax.jit(jax.grad(loss))(jnp.array(0.9)),
        lambda loss: fx.filter_grad(loss)(jnp.array(0.9)),
        lambda loss: fx.filter_vjp(loss, jnp.array(0.9))[1](jnp.array(1.0)),
        lambda loss: jax.vmap(jax.grad(loss))(jnp.ones(2)),
        lambda loss: jax.grad(lambda w: jax.vmap(loss)(w * jnp.ones(2)).sum())(1.0),
    ],
    ids=["grad", "jit-grad", "filter_grad", "filter_vjp", "vmap-grad", "grad-vmap"],
)
def test_lax_kind_reverse_mode_raises_our_error(differentiate):
    loss = partial(
        _loop_loss, x0=jnp.array([0.05, 0.1]), kind="lax", unknown_steps=True
    )
    with pytest.raises(TypeError, match=_LAX_MESSAGE):
        differentiate(loss)


def test_lax_kind_compiles_to_what_lax_while_loop_compiles_to():
    def ours(x):
        return fx.filter_while_loop(lambda x: x.sum() < 10, lambda x: x * 2, x)

    def theirs(x):
        return jax.lax.while_loop(lambda x: x.sum() < 10, lambda x: x * 2, x)

    x = jnp.ones(3)
    ours_compiled = jax.jit(ours).lower(x).compile()
    theirs_compiled = jax.jit(theirs).lower(x).compile()
    assert (
        ours_compiled.cost_analysis()["flops"]
        == theirs_compiled.cost_analysis()["flops"]
    )
    [ours_while] = jax.make_jaxpr(ours)(x).jaxpr.eqns[0].params["call_jaxpr"].eqns
    [theirs_while] = jax.make_jaxpr(theirs)(x).jaxpr.eqns
    assert str(ours_while.params["body_jaxpr"]) == str(
        theirs_while.params["body_jaxpr"]
    )


def test_gradients_reach_closed_over_values_and_skip_non_differentiable_ones():
    def loss(params):
        def body(state):
            x, i = state
            return x * params["w"] + params["frozen"].value, i + 1

        x, _ = fx.filter_while_loop(
            lambda s: s[1] < 3, body, (jnp.ones(2), jnp.array(0)), kind="checkpointed"
        )
        return x.sum()

    params = {"w": jnp.array(0.5), "frozen": fx.NonDifferentiable(jnp.ones(2))}
    grads = fx.filter_grad(loss)(params)
    assert grads["frozen"] is None or grads["frozen"].value is None
    np.testing.assert_allclose(grads["w"], 2 * (3 * 0.25 + 2 * 0.5 + 1), rtol=1e-6)


# --- Memory and recomputation of kind="checkpointed" ------------------------------


def _gradient_temp_carries(steps: int, kind: str, size: int = 1024, **options) -> float:
    def loss(w, x0):
        def body(state):
            x, i = state
            return jnp.sin(x * w) + 0.1 * x, i + 1

        x, _ = fx.filter_while_loop(
            lambda s: s[1] < steps, body, (x0, jnp.array(0)), kind=kind, **options
        )
        return (x**2).sum()

    compiled = jax.jit(jax.grad(loss)).lower(0.9, jnp.ones(size)).compile()
    return compiled.memory_analysis().temp_size_in_bytes / (4 * size)


def test_checkpointed_gradient_memory_is_bounded_at_ten_thousand_steps():
    assert _gradient_temp_carries(10_000, "checkpointed", checkpoints=16) < 32


def test_bounded_gradient_memory_grows_with_steps():
    short = _gradient_temp_carries(200, "bounded", max_steps=200)
    long = _gradient_temp_carries(400, "bounded", max_steps=400)
    assert short > 200 and long > 1.9 * short


# --- Refs --------------------------------------------------------------------------


def _key_data_unrolled(seed: int, steps: int) -> np.ndarray:
    stream = fx.RngStream(seed)
    return np.stack([jax.random.key_data(stream()) for _ in range(steps)])


def _key_data_loop(stream, kind, max_steps=None):
    """The data of the first 4 keys the stream gives inside a while loop."""

    def body(state):
        stream, keys, i = state
        return stream, keys.at[i].set(jax.random.key_data(stream())), i + 1

    keys = jnp.zeros((4, 2), jnp.uint32)
    return fx.filter_while_loop(
        lambda s: s[2] < 4,
        body,
        (stream, keys, jnp.array(0)),
        kind=kind,
        max_steps=max_steps,
    )


@pytest.mark.parametrize(
    "kind, max_steps", [("lax", None), ("bounded", 9), ("checkpointed", None)]
)
def test_rng_stream_advances_as_if_unrolled(kind, max_steps):
    stream = fx.RngStream(5)
    out_stream, keys, _ = _key_data_loop(stream, kind, max_steps)
    np.testing.assert_array_equal(keys, _key_data_unrolled(5, 4))
    assert out_stream.count is stream.count and int(stream.count[...]) == 4


def test_returning_another_ref_is_an_error():
    with pytest.raises(TypeError, match=r"carry\[0\]: Ref\(f32\[\]\) vs another Ref"):
        fx.filter_while_loop(
            lambda s: s[1] < 2,
            lambda s: (jax.new_ref(jnp.zeros(())), s[1] + 1),
            (jax.new_ref(jnp.zeros(())), jnp.array(0)),
        )


def _noisy_loss(w, stream, kind):
    def body(state):
        stream, x, i = state
        return stream, x * w + jax.random.normal(stream()), i + 1

    _, x, _ = fx.filter_while_loop(
        lambda s: s[2] < 3,
        body,
        (stream, jnp.array(1.0), jnp.array(0)),
        kind=kind,
        max_steps=6 if kind == "bounded" else None,
    )
    return x


def test_bounded_reverse_mode_with_rng_stream_equals_the_unrolled_gradient():
    def unrolled(w, stream):
        x = jnp.array(1.0)
        for _ in range(3):
            x = x * w + jax.random.normal(stream())
        return x

    stream = fx.RngStream(2)
    got = fx.filter_grad(_noisy_loss)(jnp.array(0.7), stream, "bounded")
    expected = fx.filter_grad(unrolled)(jnp.array(0.7), fx.RngStream(2))
    assert float(got) == pytest.approx(float(expected), rel=1e-6)
    assert int(stream.count[...]) == 3  # the 3 steps past the end undid their writes


def test_checkpointed_reverse_mode_refuses_a_body_that_writes_a_ref():
    stream = fx.RngStream(2)
    _noisy_loss(jnp.array(0.7), stream, "checkpointed")  # no reverse mode: fine
    with pytest.raises(
        TypeError, match=r"body writes a Ref.*would repeat those writes"
    ):
        fx.filter_grad(_noisy_loss)(jnp.array(0.7), stream, "checkpointed")


def test_checkpointed_body_may_read_a_ref():
    scale = jax.new_ref(jnp.array(2.0))

    def loss(w):
        x, _ = fx.filter_while_loop(
            lambda s: s[1] < 3,
            lambda s: (s[0] * w * scale[...], s[1] + 1),
            (jnp.array(1.0), jnp.array(0)),
            kind="checkpointed",
            checkpoints=2,
        )
        return x

    np.testing.assert_allclose(jax.grad(loss)(jnp.array(0.5)), 3 * 0.25 * 8, rtol=1e-6)


# --- fori_loop ---------------------------------------------------------------------


def test_fori_loop_with_static_bounds_is_reverse_differentiable():
    def loss(w):
        out, name = fx.filter_fori_loop(
            0, 3, lambda i, v: (v[0] * w + i, v[1]), (jnp.array(1.0), "n")
        )
        assert name == "n"
        return out

    # ((w + 0) w + 1) w + 2 = w^3 + w; derivative 3 w^2 + 1
    np.testing.assert_allclose(jax.grad(loss)(jnp.array(2.0)), 13.0)


def test_fori_loop_with_traced_bounds_is_forward_mode_only():
    def loss(w, upper):
        return fx.filter_fori_loop(0, upper, lambda i, v: v * w, jnp.array(1.0))

    value, tangent = jax.jvp(
        lambda w: jax.jit(loss)(w, 3), (jnp.array(2.0),), (jnp.array(1.0),)
    )
    assert (float(value), float(tangent)) == (8.0, 12.0)
    with pytest.raises(TypeError, match="filter_fori_loop: reverse-mode .* bounds"):
        jax.grad(jax.jit(loss))(jnp.array(2.0), 3)


def test_fori_loop_rng_stream_and_carry_errors():
    stream = fx.RngStream(0)
    _, keys = fx.filter_fori_loop(
        0,
        3,
        lambda i, v: (v[0], v[1].at[i].set(jax.random.key_data(v[0]()))),
        (stream, jnp.zeros((3, 2), jnp.uint32)),
    )
    np.testing.assert_array_equal(keys, _key_data_unrolled(0, 3))
    with pytest.raises(
        TypeError,
        match=r"filter_fori_loop: the carry changed at carry\[1\]: 'a' vs 'b'",
    ):
        fx.filter_fori_loop(0, 2, lambda i, v: (v[0], "b"), (jnp.ones(()), "a"))


# --- Nesting -----------------------------------------------------------------------


def test_checkpointed_under_filter_jit_and_filter_vmap_with_per_example_steps():
    w = jnp.array(0.9)
    x0s = jnp.array([[0.05, 0.0], [0.2, 0.1], [0.5, -0.1]])

    def loss(w, x0):
        return _loop_loss(w, x0, "checkpointed", unknown_steps=True, checkpoints=2)

    grads = fx.filter_jit(fx.filter_vmap(fx.filter_grad(loss), in_axes=(None, 0)))(
        w, x0s
    )
    expected = [
        jax.grad(_unrolled_loss)(w, x0, _steps_taken(w, x0, True)) for x0 in x0s
    ]
    np.testing.assert_allclose(grads, jnp.stack(expected), rtol=1e-5)


def test_loops_nested_in_each_other():
    def inner_sum(n):
        return fx.filter_fori_loop(0, 3, lambda i, acc: acc + n, jnp.array(0.0))

    def outer(carry, x):
        total = fx.filter_while_loop(
            lambda s: s[1] < 2,
            lambda s: (s[0] + inner_sum(x), s[1] + 1),
            (carry, jnp.array(0)),
            kind="checkpointed",
        )[0]
        return total, total

    def loss(scale):
        final, _ = fx.filter_scan(outer, jnp.array(0.0), scale * jnp.arange(3.0))
        return final

    # each x contributes 2 * 3 * x
    assert float(loss(1.0)) == 18.0
    assert float(jax.grad(loss)(1.0)) == 18.0


@pytest.mark.parametrize("kind", ["bounded", "checkpointed"])
def test_a_loop_that_takes_no_step_passes_the_cotangent_through(kind):
    def loss(x0):
        x, _ = fx.filter_while_loop(
            lambda s: s[1] < 0,
            lambda s: (s[0] * 3.0, s[1] + 1),
            (x0, jnp.array(0)),
            kind=kind,
            max_steps=4 if kind == "bounded" else None,
        )
        return (x * jnp.arange(3.0)).sum()

    np.testing.assert_array_equal(jax.grad(loss)(jnp.ones(3)), [0.0, 1.0, 2.0])


def test_bodies_writing_refs_run_under_filter_jit():
    # JAX cannot discharge Ref effects out of the forward-mode guard's
    # `custom_jvp`, so such bodies run unguarded (reverse mode then meets
    # JAX's own refusal to transpose a while loop).
    def noisy(stream, n):
        def body(c):
            x, i = c
            return x + jax.random.normal(stream(), ()), i + 1

        start = (jnp.array(0.0), jnp.array(0))
        looped = fx.filter_while_loop(lambda c: c[1] < n, body, start)[0]
        counted = fx.filter_fori_loop(
            0, n, lambda i, x: x + jax.random.normal(stream(), ()), jnp.array(0.0)
        )
        return looped, counted

    eager = noisy(fx.RngStream(0), jnp.array(3))
    compiled = fx.filter_jit(noisy)(fx.RngStream(0), jnp.array(3))
    np.testing.assert_allclose(compiled, eager)
    reference = fx.RngStream(0)
    expected = sum(jax.random.normal(reference(), ()) for _ in range(3))
    np.testing.assert_allclose(eager[0], expected, rtol=1e-5)
