"""State through every transform, checked against the same program threaded by hand.

The matrix: {`filter_jit`, `filter_vmap`, `filter_grad`, `jax.lax.scan`, a checkpoint
round trip} x {a running-statistics buffer in a `jax.Ref`, Equinox-style functional
`State` (with `nn.BatchNorm`), an `RngStream` driving `nn.Dropout`}.

Every cell runs a few steps of a small stateful model and compares what it gives
(outputs, gradients, final state, keys drawn) bit for bit with a plain-JAX version
in which every piece of state is an ordinary array passed in and returned, and
every key is folded in by hand.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import filterax as fx

BATCH, IN, OUT, STEPS, GROUPS = 5, 3, 4, 4, 2
MOMENTUM = 0.9
DROP = 0.5

XS = jax.random.normal(jax.random.key(100), (STEPS, BATCH, IN))
# For per-group state under `filter_vmap`: one batch per group and step.
GROUPED_XS = jax.random.normal(jax.random.key(101), (STEPS, GROUPS, BATCH, IN))
WEIGHT = jax.random.normal(jax.random.key(102), (IN, OUT))
DROPOUT_KEY = jax.random.key(103)


def assert_identical(actual, expected):
    """Same structure, dtypes, shapes and bytes (key arrays by their key data)."""

    def raw(leaf):
        if fx.is_key_array(leaf):
            leaf = jax.random.key_data(leaf)
        return np.asarray(leaf)

    actual_leaves, actual_def = jax.tree.flatten(actual)
    expected_leaves, expected_def = jax.tree.flatten(expected)
    assert actual_def == expected_def
    for a, e in zip(map(raw, actual_leaves), map(raw, expected_leaves)):
        assert (a.dtype, a.shape) == (e.dtype, e.shape)
        np.testing.assert_array_equal(a, e)
        assert a.tobytes() == e.tobytes(), "equal values but different bits"


def round_trip(tmp_path, tree, like):
    path = tmp_path / "checkpoint.eqx"
    fx.tree_serialise_leaves(path, tree)
    return fx.tree_deserialise_leaves(path, like)


# --- A running-statistics buffer held in a Ref -----------------------------------


class RunningCentre(fx.Module):
    """Centres its features by their running mean, a buffer updated on every call."""

    weight: jax.Array
    running_mean: jax.Ref

    def __call__(self, x):
        h = x @ self.weight
        batch_mean = jnp.mean(h, axis=0)
        self.running_mean[...] = (
            MOMENTUM * self.running_mean[...] + (1 - MOMENTUM) * batch_mean
        )
        return jnp.tanh(h - self.running_mean[...])


def running_centre(running_mean=None):
    if running_mean is None:
        running_mean = jnp.zeros(OUT)
    return RunningCentre(WEIGHT, jax.new_ref(running_mean))


def running_centre_by_hand(weight, running_mean, x):
    h = x @ weight
    running_mean = MOMENTUM * running_mean + (1 - MOMENTUM) * jnp.mean(h, axis=0)
    # A value read back from a Ref after a write under AD is not differentiated.
    return jnp.tanh(h - jax.lax.stop_gradient(running_mean)), running_mean


def centre_loss(model, x):
    return jnp.sum(model(x) ** 2)


def centre_loss_by_hand(weight, running_mean, x):
    y, running_mean = running_centre_by_hand(weight, running_mean, x)
    return jnp.sum(y**2), running_mean


def test_filter_jit_ref_buffer():
    model = running_centre()
    step = fx.filter_jit(lambda model, x: model(x))
    outputs = [step(model, x) for x in XS]

    hand_step = jax.jit(running_centre_by_hand)
    running_mean, expected = jnp.zeros(OUT), []
    for x in XS:
        y, running_mean = hand_step(WEIGHT, running_mean, x)
        expected.append(y)
    assert_identical(outputs, expected)
    assert_identical(model.running_mean[...], running_mean)


def test_filter_vmap_ref_buffer():
    # One buffer per group (integer in-axis), one shared weight (in-axis None).
    model = running_centre(jnp.zeros((GROUPS, OUT)))
    step = fx.filter_vmap(
        lambda model, x: model(x), in_axes=(RunningCentre(None, 0), 0)
    )
    outputs = [step(model, xs) for xs in GROUPED_XS]

    hand_step = jax.vmap(running_centre_by_hand, in_axes=(None, 0, 0))
    running_mean, expected = jnp.zeros((GROUPS, OUT)), []
    for xs in GROUPED_XS:
        y, running_mean = hand_step(WEIGHT, running_mean, xs)
        expected.append(y)
    assert_identical(outputs, expected)
    assert_identical(model.running_mean[...], running_mean)


def test_filter_grad_ref_buffer():
    model = running_centre()
    grads = [fx.filter_grad(centre_loss)(model, x) for x in XS]
    assert all(g.running_mean is None for g in grads)

    running_mean, expected = jnp.zeros(OUT), []
    for x in XS:
        grad, running_mean = jax.grad(centre_loss_by_hand, has_aux=True)(
            WEIGHT, running_mean, x
        )
        expected.append(grad)
    assert_identical([g.weight for g in grads], expected)
    assert_identical(model.running_mean[...], running_mean)


def test_lax_scan_ref_buffer():
    model = running_centre()
    _, outputs = jax.lax.scan(lambda carry, x: (carry, model(x)), None, XS)

    def hand_body(running_mean, x):
        y, running_mean = running_centre_by_hand(WEIGHT, running_mean, x)
        return running_mean, y

    running_mean, expected = jax.lax.scan(hand_body, jnp.zeros(OUT), XS)
    assert_identical(outputs, expected)
    assert_identical(model.running_mean[...], running_mean)


def test_checkpoint_round_trip_ref_buffer(tmp_path):
    step = fx.filter_jit(lambda model, x: model(x))
    model = running_centre()
    outputs = [step(model, x) for x in XS[:2]]
    like = RunningCentre(jnp.zeros((IN, OUT)), jax.new_ref(jnp.zeros(OUT)))
    saved = model.running_mean[...]
    model = round_trip(tmp_path, model, like)
    assert fx.is_ref(model.running_mean)
    assert_identical(model.running_mean[...], saved)
    outputs += [step(model, x) for x in XS[2:]]

    hand_step = jax.jit(running_centre_by_hand)
    running_mean, expected = jnp.zeros(OUT), []
    for x in XS:
        y, running_mean = hand_step(WEIGHT, running_mean, x)
        expected.append(y)
    assert_identical(outputs, expected)
    assert_identical(model.running_mean[...], running_mean)


# --- Equinox-style functional State, with nn.BatchNorm ----------------------------


class NormalisedLayer(fx.Module):
    """A linear layer, `tanh`, then batch normalisation; acts on one example."""

    linear: fx.nn.Linear
    norm: fx.nn.BatchNorm

    def __init__(self, key):
        self.linear = fx.nn.Linear(IN, OUT, key=key)
        self.norm = fx.nn.BatchNorm(OUT, "batch", momentum=MOMENTUM, mode="batch")

    def __call__(self, x, state):
        return self.norm(jnp.tanh(self.linear(x)), state)


def normalised_layer():
    return fx.nn.make_with_state(NormalisedLayer)(jax.random.key(104))


def batch_forward(model, state, x):
    """The layer over a batch: the batch axis is the one BatchNorm averages over."""
    forward = fx.filter_vmap(
        model, axis_name="batch", in_axes=(0, None), out_axes=(0, None)
    )
    return forward(x, state)


def normalised_loss(model, state, x):
    y, state = batch_forward(model, state, x)
    return jnp.sum(y**2), state


def parameters(model):
    """The layer's parameters as a plain dict, for the hand-threaded version."""
    return {
        "weight": model.linear.weight,
        "bias": model.linear.bias,
        "scale": model.norm.weight,
        "shift": model.norm.bias,
    }


def initial_statistics():
    return {"steps": jnp.array(0), "mean": jnp.zeros(OUT), "var": jnp.ones(OUT)}


def normalised_layer_by_hand(params, statistics, x):
    # Per example, averaging over the named batch axis as BatchNorm does: the
    # batched `jnp.mean(h, axis=0)` is equal in value but its gradient is summed
    # in another order, so it would not be bit-identical.
    def one_example(x):
        h = jnp.tanh(params["weight"] @ x + params["bias"])
        mean = jax.lax.pmean(h, "batch")
        centred = h - mean
        var = jnp.maximum(jax.lax.pmean(centred * centred, "batch"), 0)
        y = (h - mean) / jnp.sqrt(var + 1e-5) * params["scale"] + params["shift"]
        return y, (mean, var)

    y, (mean, var) = jax.vmap(one_example, axis_name="batch", out_axes=(0, None))(x)
    statistics = {
        "steps": statistics["steps"] + 1,
        "mean": MOMENTUM * statistics["mean"] + (1 - MOMENTUM) * mean,
        "var": MOMENTUM * statistics["var"] + (1 - MOMENTUM) * var,
    }
    return y, statistics


def normalised_loss_by_hand(params, statistics, x):
    y, statistics = normalised_layer_by_hand(params, statistics, x)
    return jnp.sum(y**2), statistics


def statistics_of(model, state):
    mean, var = state.get(model.norm.batch_state_index)
    return {"steps": state.get(model.norm.batch_counter), "mean": mean, "var": var}


def run_by_hand(step, params, xs):
    statistics, outputs = initial_statistics(), []
    for x in xs:
        y, statistics = step(params, statistics, x)
        outputs.append(y)
    return outputs, statistics


def test_filter_jit_functional_state():
    model, state = normalised_layer()
    step = fx.filter_jit(batch_forward)
    outputs = []
    for x in XS:
        y, state = step(model, state, x)
        outputs.append(y)

    expected, statistics = run_by_hand(
        jax.jit(normalised_layer_by_hand), parameters(model), XS
    )
    assert_identical(outputs, expected)
    assert_identical(statistics_of(model, state), statistics)


def test_filter_vmap_functional_state():
    # filter_vmap is the batch axis that BatchNorm averages over.
    model, state = normalised_layer()
    outputs = []
    for x in XS:
        y, state = batch_forward(model, state, x)
        outputs.append(y)

    expected, statistics = run_by_hand(normalised_layer_by_hand, parameters(model), XS)
    assert_identical(outputs, expected)
    assert_identical(statistics_of(model, state), statistics)


def test_filter_grad_functional_state():
    model, state = normalised_layer()
    grads = []
    for x in XS:
        grad, state = fx.filter_grad(normalised_loss, has_aux=True)(model, state, x)
        grads.append(parameters(grad))

    expected, statistics = run_by_hand(
        jax.grad(normalised_loss_by_hand, has_aux=True), parameters(model), XS
    )
    assert_identical(grads, expected)
    assert_identical(statistics_of(model, state), statistics)


def test_lax_scan_functional_state():
    model, state = normalised_layer()

    def body(state, x):
        y, state = batch_forward(model, state, x)
        return state, y

    state, outputs = jax.lax.scan(body, state, XS)

    params = parameters(model)

    def hand_body(statistics, x):
        y, statistics = normalised_layer_by_hand(params, statistics, x)
        return statistics, y

    statistics, expected = jax.lax.scan(hand_body, initial_statistics(), XS)
    assert_identical(outputs, expected)
    assert_identical(statistics_of(model, state), statistics)


def test_checkpoint_round_trip_functional_state(tmp_path):
    step = fx.filter_jit(batch_forward)
    model, state = normalised_layer()
    outputs = []
    for x in XS[:2]:
        y, state = step(model, state, x)
        outputs.append(y)
    like = fx.nn.make_with_state(NormalisedLayer)(jax.random.key(0))
    model, state = round_trip(tmp_path, (model, state), like)
    for x in XS[2:]:
        y, state = step(model, state, x)
        outputs.append(y)

    expected, statistics = run_by_hand(
        jax.jit(normalised_layer_by_hand), parameters(normalised_layer()[0]), XS
    )
    assert_identical(outputs, expected)
    assert_identical(statistics_of(model, state), statistics)


# --- An RngStream driving nn.Dropout ----------------------------------------------


class DropoutLayer(fx.Module):
    """`tanh(x @ weight)`, then dropout with keys drawn from the model's stream."""

    weight: jax.Array
    dropout: fx.nn.Dropout
    stream: fx.RngStream

    def __call__(self, x):
        return self.dropout(jnp.tanh(x @ self.weight), key=self.stream)


def dropout_layer(stream=None):
    if stream is None:
        stream = fx.RngStream(DROPOUT_KEY)
    return DropoutLayer(WEIGHT, fx.nn.Dropout(DROP), stream)


def dropout_layer_by_hand(weight, key, count, x):
    h = jnp.tanh(x @ weight)
    keep = jax.random.bernoulli(jax.random.fold_in(key, count), 1 - DROP, h.shape)
    return jnp.where(keep, h / (1 - DROP), 0.0), count + 1


def dropout_loss(model, x):
    return jnp.sum(model(x) ** 2)


def dropout_loss_by_hand(weight, key, count, x):
    y, count = dropout_layer_by_hand(weight, key, count, x)
    return jnp.sum(y**2), count


def first_count():
    return jnp.zeros((), jnp.uint32)


def test_filter_jit_rng_stream():
    model = dropout_layer()
    step = fx.filter_jit(lambda model, x: model(x))
    outputs = [step(model, x) for x in XS]

    hand_step = jax.jit(dropout_layer_by_hand)
    count, expected = first_count(), []
    for x in XS:
        y, count = hand_step(WEIGHT, DROPOUT_KEY, count, x)
        expected.append(y)
    assert_identical(outputs, expected)
    assert_identical(model.stream.count[...], count)


def test_filter_vmap_rng_stream():
    # `split` draws one key from the stream and splits it: a stream per example.
    model = dropout_layer()
    batched = fx.tree_at(lambda m: m.stream, model, model.stream.split(BATCH))
    step = fx.filter_vmap(
        lambda model, x: model(x), in_axes=(DropoutLayer(None, None, 0), 0)
    )
    outputs = [step(batched, x) for x in XS]

    keys = jax.random.split(jax.random.fold_in(DROPOUT_KEY, 0), BATCH)
    hand_step = jax.vmap(dropout_layer_by_hand, in_axes=(None, 0, 0, 0))
    counts, expected = jnp.zeros(BATCH, jnp.uint32), []
    for x in XS:
        y, counts = hand_step(WEIGHT, keys, counts, x)
        expected.append(y)
    assert_identical(outputs, expected)
    assert_identical(batched.stream.count[...], counts)
    assert_identical(model.stream.count[...], first_count() + 1)


def test_filter_grad_rng_stream():
    model = dropout_layer()
    grads = [fx.filter_grad(dropout_loss)(model, x) for x in XS]
    assert all(jax.tree.leaves(g.stream) == [] for g in grads)

    count, expected = first_count(), []
    for x in XS:
        grad, count = jax.grad(dropout_loss_by_hand, has_aux=True)(
            WEIGHT, DROPOUT_KEY, count, x
        )
        expected.append(grad)
    assert_identical([g.weight for g in grads], expected)
    assert_identical(model.stream.count[...], count)


def test_lax_scan_rng_stream():
    model = dropout_layer()
    _, outputs = jax.lax.scan(lambda carry, x: (carry, model(x)), None, XS)

    def hand_body(count, x):
        y, count = dropout_layer_by_hand(WEIGHT, DROPOUT_KEY, count, x)
        return count, y

    count, expected = jax.lax.scan(hand_body, first_count(), XS)
    assert_identical(outputs, expected)
    assert_identical(model.stream.count[...], count)


def test_checkpoint_round_trip_rng_stream(tmp_path):
    step = fx.filter_jit(lambda model, x: model(x))
    model = dropout_layer()
    outputs = [step(model, x) for x in XS[:2]]
    like = dropout_layer(fx.RngStream(jax.random.key(0)))
    model = round_trip(tmp_path, model, like)
    assert fx.is_ref(model.stream.count)
    assert_identical(model.stream.count[...], first_count() + 2)
    outputs += [step(model, x) for x in XS[2:]]

    hand_step = jax.jit(dropout_layer_by_hand)
    count, expected = first_count(), []
    for x in XS:
        y, count = hand_step(WEIGHT, DROPOUT_KEY, count, x)
        expected.append(y)
    assert_identical(outputs, expected)
    assert_identical(model.stream.count[...], count)
