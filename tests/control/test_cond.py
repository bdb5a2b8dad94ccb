"""`filter_cond` and `filter_switch`: any pytree in and out, branch
agreement errors naming the branches and the key path, Refs, nesting."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx


def _scale(x, config):
    return {"y": x * config["factor"], "name": config["name"]}


def _shift(x, config):
    return {"y": x + config["factor"], "name": config["name"]}


@pytest.mark.parametrize("pred, expected", [(True, 6.0), (False, 5.0)])
def test_cond_runs_the_chosen_branch_with_static_operands(pred, expected):
    out = fx.filter_cond(
        jnp.array(pred), _scale, _shift, jnp.array(3.0), {"factor": 2, "name": "n"}
    )
    assert out["name"] == "n"
    assert float(out["y"]) == expected


def test_switch_runs_the_chosen_branch_and_clamps_the_index():
    branches = [lambda x: x + 1, lambda x: x * 10, lambda x: -x]
    results = [
        int(fx.filter_switch(jnp.array(i), branches, jnp.array(2)))
        for i in (0, 1, 2, 7)
    ]
    assert results == [3, 20, -2, -2]


def test_static_outputs_come_back_as_python_values():
    out = fx.filter_cond(
        jnp.array(True),
        lambda x: (x, "label", 3),
        lambda x: (-x, "label", 3),
        jnp.ones(2),
    )
    assert out[1:] == ("label", 3)


def test_branch_shape_mismatch_names_both_branches_and_the_path():
    with pytest.raises(
        TypeError,
        match=r"true_fun and false_fun return different outputs at out\['y'\] "
        r"\(true_fun vs false_fun\): f32\[2\] vs f32\[3\]",
    ):
        fx.filter_cond(
            jnp.array(True),
            lambda x: {"y": x},
            lambda x: {"y": jnp.concatenate([x, x[:1]])},
            jnp.ones(2),
        )


def test_branch_static_mismatch_names_the_branches_and_both_values():
    with pytest.raises(
        TypeError, match=r"branch 0 and branch 2 .* at out\[1\] .*'relu' vs 'tanh'"
    ):
        fx.filter_switch(
            jnp.array(0),
            [lambda x: (x, "relu"), lambda x: (x, "relu"), lambda x: (x, "tanh")],
            jnp.ones(2),
        )


def test_branch_structure_mismatch_is_an_error():
    with pytest.raises(
        TypeError,
        match=r"at out \(true_fun vs false_fun\): a tuple of length 2 vs a tuple of length 1",
    ):
        fx.filter_cond(jnp.array(True), lambda x: (x, x), lambda x: (x,), jnp.ones(2))


def test_branch_dtype_mismatch_is_an_error():
    with pytest.raises(
        TypeError, match=r"at out \(true_fun vs false_fun\): f32\[2\] vs i32\[2\]"
    ):
        fx.filter_cond(
            jnp.array(False), lambda x: x, lambda x: x.astype(jnp.int32), jnp.ones(2)
        )


def test_empty_switch_is_an_error():
    with pytest.raises(ValueError, match="must not be empty"):
        fx.filter_switch(0, [], 1)


def test_refs_are_shared_with_the_branches():
    ref = jax.new_ref(jnp.zeros(()))

    def add(state, x):
        state["ref"][...] += x
        return state

    def keep(state, x):
        return state

    out = fx.filter_cond(jnp.array(True), add, keep, {"ref": ref}, jnp.array(2.0))
    assert out["ref"] is ref
    assert float(ref[...]) == 2.0
    fx.filter_cond(jnp.array(False), add, keep, {"ref": ref}, jnp.array(5.0))
    assert float(ref[...]) == 2.0


def test_branches_returning_different_refs_is_an_error():
    first, second = jax.new_ref(jnp.zeros(())), jax.new_ref(jnp.zeros(()))
    with pytest.raises(
        TypeError,
        match=r"at out \(true_fun vs false_fun\): Ref\(f32\[\]\) vs another Ref",
    ):
        fx.filter_cond(jnp.array(True), lambda a, b: a, lambda a, b: b, first, second)


def test_rng_stream_in_a_branch_advances_only_when_taken():
    stream = fx.RngStream(3)
    draw = fx.filter_cond(
        jnp.array(True),
        lambda s: jax.random.normal(s(), (2,)),
        lambda s: jnp.zeros(2),
        stream,
    )
    np.testing.assert_array_equal(draw, jax.random.normal(fx.RngStream(3)(), (2,)))
    fx.filter_cond(jnp.array(False), lambda s: s(), lambda s: s.key, stream)
    assert int(stream.count[...]) == 1


def test_gradients_flow_through_the_taken_branch():
    def loss(params, pred):
        out = fx.filter_cond(
            pred,
            lambda p: p["w"] ** 2 * p["frozen"].value,
            lambda p: p["w"] * 3.0,
            params,
        )
        return out.sum()

    params = {"w": jnp.array([1.0, 2.0]), "frozen": fx.NonDifferentiable(jnp.ones(2))}
    grads = fx.filter_grad(loss)(params, jnp.array(True))
    np.testing.assert_allclose(grads["w"], [2.0, 4.0])
    assert grads["frozen"] is None or grads["frozen"].value is None
    np.testing.assert_allclose(
        fx.filter_grad(loss)(params, jnp.array(False))["w"], [3.0, 3.0]
    )


def test_under_filter_jit_and_filter_vmap():
    @fx.filter_jit
    def pick(index, x, name):
        return fx.filter_switch(
            index, [lambda x: (x + 1, name), lambda x: (x * 2, name)], x
        )

    batched = fx.filter_vmap(pick, in_axes=(0, 0, None))(
        jnp.array([0, 1, 1]), jnp.array([1.0, 2.0, 3.0]), "n"
    )
    np.testing.assert_allclose(batched[0], [2.0, 4.0, 6.0])
    assert batched[1] == "n"


def test_branches_are_traced_once_each():
    calls = []

    def branch(tag):
        def run(x):
            calls.append(tag)
            return x

        return run

    fx.filter_switch(jnp.array(1), [branch(0), branch(1), branch(2)], jnp.ones(2))
    assert sorted(calls) == [0, 1, 2]


def test_forward_pass_is_the_same_jaxpr_as_lax_cond():
    def ours(p, x):
        return fx.filter_cond(p, lambda x: jnp.sin(x), lambda x: x * 2, x)

    def theirs(p, x):
        return jax.lax.cond(p, lambda x: jnp.sin(x), lambda x: x * 2, x)

    args = (jnp.array(True), jnp.ones(3))
    assert str(jax.make_jaxpr(ours)(*args)) == str(jax.make_jaxpr(theirs)(*args))
