"""Deprecated names and arguments kept for Equinox code warn with
`FilteraxDeprecationWarning`: shown by default, and a `UserWarning` as
Equinox's are; `tree_inference` does not warn, as in Equinox. Differentiating
an argument with nothing to differentiate warns with
`NoDifferentiableLeafWarning`. Every warning filterax gives is a
`FilteraxWarning` (and so a `UserWarning`)."""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import pytest

import filterax as fx


def _layer_norm_with_elementwise_affine():
    fx.nn.LayerNorm(3, elementwise_affine=False)


def _dropout_deterministic():
    fx.nn.Dropout(0.5)(jnp.ones(3), deterministic=True)


def _static_field():
    fx.static_field(default=1)


def _defvjp():
    identity = fx.filter_custom_vjp(lambda x: x)
    identity.defvjp(lambda x: (x, None), lambda res, g, x: g)


@pytest.mark.parametrize(
    "deprecated",
    [
        _layer_norm_with_elementwise_affine,
        _dropout_deterministic,
        _static_field,
        _defvjp,
    ],
)
def test_deprecations_warn_as_user_and_future_warnings(deprecated):
    with pytest.warns(UserWarning, match="deprecated") as caught:
        deprecated()
    assert caught[0].category is fx.FilteraxDeprecationWarning
    assert issubclass(caught[0].category, FutureWarning)
    assert caught[0].filename == __file__  # points at the caller


def test_deprecations_are_shown_under_pythons_default_filters():
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()  # Python's defaults hide DeprecationWarning
        warnings.simplefilter("default")
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        _static_field()
    assert [w.category for w in caught] == [fx.FilteraxDeprecationWarning]


def test_tree_inference_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = fx.tree_inference(fx.nn.Dropout(0.5), True)
    assert model.inference is True
    assert model == fx.nn.inference_mode(fx.nn.Dropout(0.5), True)


def test_a_stacklevel_past_the_top_of_the_stack_still_warns():
    from filterax._warnings import warn_at_caller

    with pytest.warns(UserWarning, match="past the top"):
        warn_at_caller("past the top", UserWarning, 10_000)


# ------------------------------------------------------- NoDifferentiableLeafWarning


def _loss(model, x):
    return (model * x).sum()


def test_filter_grad_of_an_int_array_warns_naming_the_argument():
    with pytest.warns(
        fx.NoDifferentiableLeafWarning,
        match=r"filter_grad: the first argument of `_loss` \(`model`\) holds no "
        r"differentiable leaf \(an array of shape \(3,\) and dtype int32\)",
    ) as caught:
        grads = fx.filter_grad(_loss)(jnp.arange(3), jnp.ones(3))
    assert grads is None
    assert caught[0].filename == __file__  # the user's line, not filterax's


def test_filter_grad_with_swapped_arguments_warns():
    model = {"w": jnp.ones(3), "act": "relu"}

    def loss(x, model):
        return (model["w"] * x).sum()

    with pytest.warns(fx.NoDifferentiableLeafWarning, match=r"`loss` \(`x`\)"):
        fx.filter_grad(loss)(jnp.arange(3), model)


def test_filter_value_and_grad_and_filter_vjp_warn_too():
    with pytest.warns(fx.NoDifferentiableLeafWarning, match="filter_value_and_grad"):
        fx.filter_value_and_grad(_loss)(jnp.arange(3), jnp.ones(3))
    with pytest.warns(fx.NoDifferentiableLeafWarning, match="filter_vjp: the primals"):
        fx.filter_vjp(lambda x: x["n"] * 2, {"n": jnp.arange(3)})


def test_no_differentiable_leaf_warns_once_per_call_site():
    grad = fx.filter_grad(_loss)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            grad(jnp.arange(3), jnp.ones(3))
    assert [w.category for w in caught] == [fx.NoDifferentiableLeafWarning]


def test_no_differentiable_leaf_warns_at_trace_time_under_filter_jit():
    step = fx.filter_jit(fx.filter_grad(_loss))
    with pytest.warns(fx.NoDifferentiableLeafWarning):
        step(jnp.arange(3), jnp.ones(3))


def test_no_warning_for_a_frozen_or_empty_argument_or_one_with_parameters():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fx.filter_grad(lambda m: m.value.sum())(fx.NonDifferentiable(jnp.ones(2)))
        fx.filter_grad(lambda m, x: x.sum())(None, jnp.ones(2))
        fx.filter_grad(lambda m: (m["w"] ** 2).sum())({"w": jnp.ones(2), "n": 3})


def test_no_differentiable_leaf_warning_can_be_filtered_by_category():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=fx.NoDifferentiableLeafWarning)
        assert fx.filter_grad(_loss)(jnp.arange(3), jnp.ones(3)) is None
    assert issubclass(fx.NoDifferentiableLeafWarning, UserWarning)
    assert fx.NoDifferentiableLeafWarning.__module__ == "filterax"


def _batch_norm_without_mode():
    fx.nn.BatchNorm(3, "batch")


def _not_init_array():
    class Derived(fx.Module):
        x: jnp.ndarray
        doubled: jnp.ndarray = fx.field(init=False)

        def __post_init__(self):
            self.doubled = 2 * self.x

    Derived(jnp.ones(2))


def _post_init_ignored():
    class Both(fx.Module):
        x: int

        def __init__(self, x):
            self.x = x

        def __post_init__(self):
            pass


def _static_array():
    class Table(fx.Module):
        values: object = fx.field(static=True)

    Table(jnp.arange(3))


def _nothing_to_differentiate():
    fx.filter_grad(lambda x: (x * 1.0).sum())(jnp.arange(3))


@pytest.mark.parametrize(
    "warns",
    [
        _batch_norm_without_mode,
        _not_init_array,
        _post_init_ignored,
        _static_array,
        _nothing_to_differentiate,
        _dropout_deterministic,
    ],
)
def test_every_warning_is_a_filterax_warning_and_a_user_warning(warns) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warns()
    assert caught, f"{warns.__name__} gave no warning"
    for warning in caught:
        assert issubclass(warning.category, fx.FilteraxWarning), warning.category
        assert issubclass(warning.category, UserWarning)


def test_one_filter_silences_every_filterax_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=fx.FilteraxWarning)
        _batch_norm_without_mode()
        _static_array()
        _nothing_to_differentiate()
