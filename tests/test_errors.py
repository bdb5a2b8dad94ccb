"""`error_if` and `branched_error_if`: checks at trace time and at run time,
under `jit`, `filter_jit`, `vmap` and differentiation, in every `on_error` mode."""

from __future__ import annotations

import io
import logging
import re
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import filterax as fx
from filterax._errors import runtime_error_from


@pytest.fixture(autouse=True)
def _default_mode(monkeypatch):
    # The default mode comes from the environment: start every test from none.
    monkeypatch.delenv("FILTERAX_ON_ERROR", raising=False)
    monkeypatch.delenv("EQX_ON_ERROR", raising=False)
    monkeypatch.delenv("FILTERAX_ON_ERROR_BREAKPOINT_FRAMES", raising=False)
    monkeypatch.delenv("EQX_ON_ERROR_BREAKPOINT_FRAMES", raising=False)


def sqrt_of_non_negative(x):
    x = fx.error_if(x, x < 0, "x must be non-negative")
    return jnp.sqrt(x)


class _NoInput(io.TextIOBase):
    """A standard input that fails the test if anything reads it."""

    def readline(self, size: int = -1) -> str:
        raise AssertionError("the debugger opened")

    def read(self, size: int | None = -1) -> str:
        raise AssertionError("the debugger opened")


# --- The error class ---------------------------------------------------------------


def test_the_equinox_name_is_the_same_class():
    assert fx.EquinoxRuntimeError is fx.FilteraxRuntimeError
    assert issubclass(fx.FilteraxRuntimeError, RuntimeError)


def test_the_error_is_shown_under_its_public_name():
    assert fx.FilteraxRuntimeError.__module__ == "filterax"


def test_unrelated_errors_are_not_translated():
    assert runtime_error_from(RuntimeError("x must be non-negative")) is None
    assert runtime_error_from(jax.errors.JaxRuntimeError("INTERNAL: oops")) is None


# --- Passing checks ----------------------------------------------------------------


def test_a_passing_check_returns_its_argument_under_jit():
    out = jax.jit(sqrt_of_non_negative)(jnp.array([4.0, 9.0]))
    np.testing.assert_allclose(out, [2.0, 3.0])


def test_a_passing_check_keeps_non_array_leaves():
    def check(x):
        tree = {"values": x, "label": "positive", "scale": 2}
        return fx.error_if(tree, x < 0, "negative")

    out = fx.filter_jit(check)(jnp.ones(2))
    assert out["label"] == "positive" and out["scale"] == 2
    np.testing.assert_array_equal(out["values"], jnp.ones(2))


def test_a_concrete_false_predicate_returns_x_even_without_arrays():
    assert fx.error_if("no arrays here", False, "never") == "no arrays here"


def test_a_passing_check_under_vmap_keeps_the_branch():
    # Under vmap the predicate is reduced over the batch, so that the check stays
    # a branch taken only on failure instead of work done for every element.
    jaxpr = jax.make_jaxpr(jax.vmap(sqrt_of_non_negative))(jnp.ones(3))
    assert "cond[" in str(jaxpr)
    assert "select_n" not in str(jaxpr).split("cond[")[0]


# --- Failing checks at run time -----------------------------------------------------


def test_a_failing_check_under_jax_jit_raises_with_its_message():
    with pytest.raises(jax.errors.JaxRuntimeError, match="x must be non-negative"):
        jax.jit(sqrt_of_non_negative)(jnp.array(-1.0))


def test_the_jax_jit_error_suggests_filter_jit_and_the_breakpoint_mode():
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.jit(sqrt_of_non_negative)(jnp.array(-1.0))
    assert "filterax.filter_jit" in str(info.value)
    assert "FILTERAX_ON_ERROR=breakpoint" in str(info.value)


def test_a_failing_check_under_filter_jit_raises_filterax_runtime_error():
    with pytest.raises(fx.FilteraxRuntimeError) as info:
        fx.filter_jit(sqrt_of_non_negative)(jnp.array(-1.0))
    assert type(info.value) is fx.FilteraxRuntimeError
    assert info.value.__cause__ is None


def test_the_filter_jit_error_shows_the_stack_inside_jit_and_how_to_debug():
    @fx.filter_jit
    def outer(x):
        return inner(x) + 1

    @fx.filter_jit
    def inner(x):
        return fx.error_if(x, x > 0, "x must not be positive")

    with pytest.raises(fx.FilteraxRuntimeError) as info:
        outer(jnp.array(1.0))
    message = str(info.value)
    assert message.startswith("Above is the stack outside of JIT")
    inside = message.split("filterax.FilteraxRuntimeError:")[0]
    assert "in outer" in inside and "in inner" in inside
    assert "return inner(x) + 1" in inside
    assert "site-packages" not in inside and "filterax/_" not in inside
    assert "x must not be positive" in message
    assert "FILTERAX_ON_ERROR=breakpoint" in message
    assert "EQX_ON_ERROR=breakpoint" in message


def test_a_compilation_that_passed_before_fails_later():
    check = fx.filter_jit(sqrt_of_non_negative)
    check(jnp.array(1.0))
    with pytest.raises(fx.FilteraxRuntimeError, match="x must be non-negative"):
        check(jnp.array(-1.0))
    np.testing.assert_allclose(check(jnp.array(4.0)), 2.0)


def test_failed_checks_are_not_logged(caplog):
    # JAX logs an exception raised in a callback with its traceback; the error
    # that follows already reports a failed check.
    with pytest.raises(jax.errors.JaxRuntimeError):
        jax.jit(sqrt_of_non_negative)(jnp.array(-1.0))
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_other_failing_callbacks_are_still_logged(caplog):
    def fails(x):
        raise KeyError("not a check")

    @jax.jit
    def f(x):
        return jax.pure_callback(fails, jax.ShapeDtypeStruct((), jnp.float32), x)

    with pytest.raises(jax.errors.JaxRuntimeError):
        f(jnp.array(1.0))
    assert "not a check" in caplog.text


def test_a_check_on_a_constant_equal_to_its_fill_value_is_kept():
    # `x` is NaN, the value a failed check puts in its place: the compiler must
    # still see that the output depends on the check.
    @jax.jit
    def f(pred):
        return fx.error_if(jnp.array(jnp.nan), pred, "constant checked")

    with pytest.raises(jax.errors.JaxRuntimeError, match="constant checked"):
        f(jnp.array(True))


def test_a_check_on_key_arrays():
    key = jax.random.key(0)
    check = jax.jit(lambda k, p: fx.error_if(k, p, "bad key"))
    assert jnp.array_equal(
        jax.random.key_data(check(key, False)), jax.random.key_data(key)
    )
    with pytest.raises(jax.errors.JaxRuntimeError, match="bad key"):
        check(key, jnp.array(True))


def test_a_check_inside_scan():
    def body(carry, x):
        return carry + fx.error_if(x, x < 0, "negative step"), None

    scan = jax.jit(lambda xs: jax.lax.scan(body, 0.0, xs)[0])
    assert float(scan(jnp.arange(3.0))) == 3.0
    with pytest.raises(jax.errors.JaxRuntimeError, match="negative step"):
        scan(jnp.array([1.0, -1.0]))


# --- vmap ---------------------------------------------------------------------------


def test_eager_vmap_names_the_failing_batch_index():
    with pytest.raises(fx.FilteraxRuntimeError) as info:
        jax.vmap(sqrt_of_non_negative)(jnp.array([1.0, -1.0, 2.0]))
    message = str(info.value)
    assert "Batch index (1,) had error:\nx must be non-negative" in message
    assert "Batch index (0,)" not in message and "Batch index (2,)" not in message


def test_jitted_vmap_names_every_failing_batch_index():
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        jax.jit(jax.vmap(sqrt_of_non_negative))(jnp.array([-1.0, 1.0, -2.0]))
    expected = (
        "Batch index (0,) had error:\nx must be non-negative\n\n"
        "Batch index (2,) had error:\nx must be non-negative"
    )
    assert expected in str(info.value)


def test_filter_vmap_names_the_failing_batch_index():
    with pytest.raises(fx.FilteraxRuntimeError, match=re.escape("Batch index (1,)")):
        fx.filter_vmap(sqrt_of_non_negative)(jnp.array([1.0, -1.0]))


def test_nested_vmap_names_both_indices():
    x = jnp.array([[1.0, 2.0], [3.0, -4.0]])
    with pytest.raises(fx.FilteraxRuntimeError) as info:
        jax.vmap(jax.vmap(sqrt_of_non_negative))(x)
    assert "Batch index (1, 1) had error" in str(info.value)
    assert str(info.value).count("Batch index") == 1


def test_a_predicate_that_does_not_depend_on_the_batch_has_no_batch_index():
    def check(x, flag):
        return fx.error_if(x, flag, "flag set")

    vmapped = jax.jit(jax.vmap(check, in_axes=(0, None)))
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
        vmapped(jnp.ones(3), jnp.array(True))
    assert "flag set" in str(info.value)
    assert "Batch index" not in str(info.value)


def test_many_failing_batch_elements_are_summarised():
    with pytest.raises(fx.FilteraxRuntimeError) as info:
        jax.vmap(sqrt_of_non_negative)(-jnp.ones(25))
    assert str(info.value).count("Batch index") == 10
    assert "15 more batch elements" in str(info.value)


def test_vmap_inside_a_scan_names_the_batch_index():
    def body(carry, x):
        return carry, fx.error_if(x, x < 0, "negative")

    f = jax.jit(jax.vmap(lambda xs: jax.lax.scan(body, 0.0, xs)[1]))
    with pytest.raises(jax.errors.JaxRuntimeError, match=re.escape("Batch index (1,)")):
        f(jnp.array([[1.0, 2.0], [3.0, -1.0]]))


# --- branched_error_if ---------------------------------------------------------------


def classify(x):
    kind = jnp.where(jnp.isnan(x), 1, jnp.where(jnp.isinf(x), 2, 0))
    bad = (x < 0) | ~jnp.isfinite(x)
    return fx.branched_error_if(x, bad, kind, ["negative", "not a number", "infinite"])


@pytest.mark.parametrize(
    "value, message",
    [(-1.0, "negative"), (jnp.nan, "not a number"), (jnp.inf, "infinite")],
)
def test_branched_error_if_chooses_the_message_at_run_time(value, message):
    with pytest.raises(jax.errors.JaxRuntimeError, match=message):
        jax.jit(classify)(jnp.array(value))


def test_branched_error_if_reports_each_batch_elements_own_message():
    with pytest.raises(fx.FilteraxRuntimeError) as info:
        jax.vmap(classify)(jnp.array([1.0, jnp.inf, -1.0]))
    message = str(info.value)
    assert "Batch index (1,) had error:\ninfinite" in message
    assert "Batch index (2,) had error:\nnegative" in message


def test_branched_error_if_with_a_concrete_index_fails_at_trace_time():
    with pytest.raises(fx.FilteraxRuntimeError, match="second"):
        fx.branched_error_if(jnp.ones(2), True, 1, ["first", "second"])


def test_an_index_out_of_range_at_run_time_says_so():
    f = jax.jit(lambda x, i: fx.branched_error_if(x, x > 0, i, ["only one"]))
    with pytest.raises(jax.errors.JaxRuntimeError, match="index=3"):
        f(jnp.array(1.0), jnp.array(3))


# --- Differentiation ----------------------------------------------------------------


def test_grad_through_a_passing_check():
    gradient = jax.jit(jax.grad(sqrt_of_non_negative))(jnp.array(4.0))
    np.testing.assert_allclose(gradient, 0.25)


@pytest.mark.parametrize("jit", [False, True])
def test_grad_through_a_failing_check_raises(jit):
    grad = jax.grad(sqrt_of_non_negative)
    grad = jax.jit(grad) if jit else grad
    with pytest.raises((fx.FilteraxRuntimeError, jax.errors.JaxRuntimeError)):
        grad(jnp.array(-1.0))


def test_the_tangent_passes_through_unchanged():
    identity = lambda x: fx.error_if(x, x < 0, "negative")  # noqa: E731
    primal, tangent = jax.jit(lambda p, t: jax.jvp(identity, (p,), (t,)))(
        jnp.array(2.0), jnp.array(-3.0)
    )
    assert float(primal) == 2.0 and float(tangent) == -3.0


def test_jvp_with_a_failing_primal_raises():
    f = jax.jit(lambda p, t: jax.jvp(sqrt_of_non_negative, (p,), (t,)))
    with pytest.raises(jax.errors.JaxRuntimeError, match="x must be non-negative"):
        f(jnp.array(-1.0), jnp.array(1.0))


def test_grad_of_vmap_names_the_batch_index():
    loss = lambda xs: jnp.sum(jax.vmap(sqrt_of_non_negative)(xs))  # noqa: E731
    with pytest.raises(jax.errors.JaxRuntimeError, match=re.escape("Batch index (0,)")):
        jax.jit(jax.grad(loss))(jnp.array([-1.0, 4.0]))


# --- Predicates known while tracing ------------------------------------------------


def test_a_true_python_bool_fails_while_tracing():
    traced_after_check = []

    @jax.jit
    def f(x):
        x = fx.error_if(x, True, "always wrong")
        traced_after_check.append(True)
        return x

    with pytest.raises(fx.FilteraxRuntimeError, match="always wrong"):
        f(jnp.array(1.0))
    assert traced_after_check == []


def test_a_concrete_true_array_fails_at_once():
    with pytest.raises(fx.FilteraxRuntimeError, match="negative"):
        fx.error_if(jnp.array(-1.0), jnp.array([False, True]), "negative")


def test_a_concrete_true_predicate_fails_even_without_arrays():
    with pytest.raises(fx.FilteraxRuntimeError, match="bad config"):
        fx.error_if({"depth": -1}, True, "bad config")


# --- on_error modes -----------------------------------------------------------------


def test_nan_mode_replaces_the_checked_values():
    f = jax.jit(lambda x, p: fx.error_if(x, p, "bad", on_error="nan"))
    assert jnp.isnan(f(jnp.array(1.0), jnp.array(True)))
    assert float(f(jnp.array(1.0), jnp.array(False))) == 1.0


def test_nan_mode_fills_integers_and_booleans_too():
    tree = {
        "i": jnp.array([1, 2], jnp.int32),
        "b": jnp.array([False]),
        "f": jnp.ones(2),
    }
    out = jax.jit(lambda t: fx.error_if(t, t["i"][0] > 0, "bad", on_error="nan"))(tree)
    assert out["i"].tolist() == [np.iinfo(np.int32).max] * 2
    assert out["b"].tolist() == [True]
    assert jnp.isnan(out["f"]).all()


def test_nan_mode_under_vmap_fills_only_the_failing_elements():
    f = jax.vmap(lambda x: fx.error_if(x, x < 0, "negative", on_error="nan"))
    out = f(jnp.array([1.0, -2.0, 3.0]))
    assert out[0] == 1.0 and jnp.isnan(out[1]) and out[2] == 3.0


def test_nan_mode_at_trace_time_warns_and_fills():
    with pytest.warns(UserWarning, match="returning NaN"):
        out = fx.error_if({"x": jnp.ones(2), "n": 3}, True, "bad", on_error="nan")
    assert jnp.isnan(out["x"]).all() and out["n"] == 3


@pytest.mark.filterwarnings("ignore:error_if")
def test_nan_mode_has_the_same_gradient_at_trace_time_as_compiled():
    # The identity's gradient, as in Equinox: the NaN value poisons what uses
    # it (`x**2`), and a check settled while tracing passes no zeros on.
    def check(x):
        return fx.error_if(x, x < 0, "negative", on_error="nan")

    x = jnp.array([-3.0, 2.0])
    for loss in (lambda x: check(x).sum(), lambda x: (check(x) ** 2).sum()):
        eager, compiled = jax.grad(loss)(x), jax.jit(jax.grad(loss))(x)
        np.testing.assert_array_equal(eager, compiled)
    np.testing.assert_array_equal(jax.grad(lambda x: check(x).sum())(x), [1.0, 1.0])
    assert jnp.isnan(jax.grad(lambda x: (check(x) ** 2).sum())(x)).all()


def test_off_mode_returns_x_and_compiles_no_check():
    f = lambda x, p: fx.error_if(x, p, "bad", on_error="off")  # noqa: E731
    assert float(jax.jit(f)(jnp.array(1.0), jnp.array(True))) == 1.0
    assert "callback" not in str(jax.make_jaxpr(f)(jnp.array(1.0), jnp.array(True)))


def test_off_mode_ignores_a_true_predicate_at_trace_time():
    assert float(fx.error_if(jnp.array(1.0), True, "bad", on_error="off") + 1) == 2.0


def test_breakpoint_mode_prints_opens_the_debugger_and_continues_with_nan(
    monkeypatch, capsys
):
    monkeypatch.setattr(sys, "stdin", io.StringIO("c\n"))
    f = jax.jit(lambda x: fx.error_if(x, x > 0, "too big", on_error="breakpoint"))
    out = f(jnp.array(1.0))
    jax.effects_barrier()
    printed = capsys.readouterr().out
    assert "filterax.FilteraxRuntimeError: too big" in printed
    assert "Entering jdb" in printed
    assert jnp.isnan(out)


def test_the_debugger_reaches_the_users_frame(monkeypatch, capsys):
    def user_code(x):
        doubled = 2 * x
        return fx.error_if(doubled, doubled > 0, "positive", on_error="breakpoint")

    # Move up past filterax's frames (extra `u`s stop at the top), then print.
    monkeypatch.setattr(sys, "stdin", io.StringIO("u\n" * 20 + "p doubled\nc\n"))
    jax.jit(user_code)(jnp.array(3.0))
    jax.effects_barrier()
    assert "Array(6., dtype=float32" in capsys.readouterr().out


def test_breakpoint_mode_under_vmap_still_stops(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("c\n"))
    f = jax.vmap(lambda x: fx.error_if(x, x < 0, "negative", on_error="breakpoint"))
    out = f(jnp.array([1.0, -1.0]))
    printed = capsys.readouterr().out
    assert "Batch index (1,) had error:\nnegative" in printed
    assert "Entering jdb" in printed
    assert out[0] == 1.0 and jnp.isnan(out[1])


def test_a_passing_check_in_breakpoint_mode_opens_no_debugger(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", _NoInput())
    f = jax.jit(lambda x: fx.error_if(x, x > 0, "too big", on_error="breakpoint"))
    assert float(f(jnp.array(-1.0))) == -1.0
    jax.effects_barrier()
    assert "jdb" not in capsys.readouterr().out


def test_breakpoint_mode_at_trace_time_calls_pythons_breakpoint(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(sys, "breakpointhook", lambda *a, **k: calls.append(1))
    out = fx.error_if(jnp.array(1.0), True, "known bad", on_error="breakpoint")
    assert calls == [1]
    assert "known bad" in capsys.readouterr().out
    assert float(out) == 1.0


def test_the_default_mode_reads_filterax_on_error(monkeypatch):
    monkeypatch.setenv("FILTERAX_ON_ERROR", "nan")
    out = jax.jit(lambda x: fx.error_if(x, x > 0, "bad"))(jnp.array(1.0))
    assert jnp.isnan(out)


def test_the_default_mode_reads_eqx_on_error(monkeypatch):
    monkeypatch.setenv("EQX_ON_ERROR", "off")
    out = jax.jit(lambda x: fx.error_if(x, x > 0, "bad"))(jnp.array(1.0))
    assert float(out) == 1.0


def test_filterax_on_error_wins_over_eqx_on_error(monkeypatch):
    monkeypatch.setenv("FILTERAX_ON_ERROR", "nan")
    monkeypatch.setenv("EQX_ON_ERROR", "off")
    assert jnp.isnan(jax.jit(lambda x: fx.error_if(x, x > 0, "bad"))(jnp.array(1.0)))


def test_an_explicit_mode_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("FILTERAX_ON_ERROR", "off")
    with pytest.raises(fx.FilteraxRuntimeError):
        fx.error_if(jnp.array(1.0), True, "bad", on_error="raise")


def test_an_invalid_environment_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("EQX_ON_ERROR", "loud")
    with pytest.raises(ValueError, match="EQX_ON_ERROR='loud'"):
        fx.error_if(jnp.array(1.0), False, "bad")


# --- Bad input ----------------------------------------------------------------------


def test_an_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="on_error='loud'"):
        fx.error_if(jnp.array(1.0), False, "bad", on_error="loud")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="on_error='loud'"):  # as Equinox
        fx.error_if(jnp.array(1.0), False, "bad", on_error="loud")  # type: ignore[arg-type]


def test_a_non_numeric_predicate_is_rejected():
    with pytest.raises(TypeError, match="boolean"):
        fx.error_if(jnp.array(1.0), "yes", "bad")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="boolean"):
        fx.error_if(jnp.array(1.0), jax.random.key(0), "bad")


def test_a_numeric_predicate_counts_by_its_truth():
    # As in Equinox: `error_if(x, jnp.sum(x < 0), ...)` fails when non-zero.
    check = fx.filter_jit(lambda x: fx.error_if(x, jnp.sum(x < 0), "negatives"))
    np.testing.assert_array_equal(check(jnp.ones(2)), jnp.ones(2))
    with pytest.raises(fx.FilteraxRuntimeError, match="negatives"):
        check(jnp.array([1.0, -1.0]))
    assert fx.error_if(jnp.ones(2), 0, "zero passes") is not None
    with pytest.raises(fx.FilteraxRuntimeError, match="non-zero fails"):
        fx.error_if(jnp.ones(2), jnp.array(2.0), "non-zero fails")


def test_a_non_string_message_is_rejected():
    with pytest.raises(TypeError, match="msg"):
        fx.error_if(jnp.array(1.0), False, 42)  # type: ignore[arg-type]


def test_a_single_string_as_msgs_is_rejected():
    with pytest.raises(TypeError, match="sequence of strings"):
        fx.branched_error_if(jnp.array(1.0), False, 0, "oops")


def test_a_known_index_out_of_range_is_rejected():
    with pytest.raises(ValueError, match="out of range"):
        fx.branched_error_if(jnp.array(1.0), False, 2, ["a", "b"])


def test_an_array_of_indices_reports_the_largest():
    # Equinox's reading of an index computed elementwise next to the predicate.
    def check(x):
        kind = jnp.where(jnp.isnan(x), 1, 0)
        return fx.branched_error_if(
            x, jnp.isnan(x) | (x < 0), kind, ["negative", "NaN"]
        )

    jitted = fx.filter_jit(check)
    np.testing.assert_array_equal(jitted(jnp.ones(2)), jnp.ones(2))
    with pytest.raises(fx.FilteraxRuntimeError, match="NaN"):
        jitted(jnp.array([-1.0, jnp.nan]))
    with pytest.raises(fx.FilteraxRuntimeError, match="negative"):
        jitted(jnp.array([-1.0, 2.0]))
    with pytest.raises(ValueError, match="`index`=2 is out of range"):
        fx.branched_error_if(jnp.ones(2), False, jnp.array([0, 2]), ["a", "b"])


def test_a_runtime_check_needs_an_array_to_attach_to():
    with pytest.raises(ValueError, match="no array"):
        jax.jit(lambda p: fx.error_if(1.0, p, "bad"))(jnp.array(True))


def test_an_invalid_breakpoint_frame_count_names_the_variable(monkeypatch):
    monkeypatch.setenv("FILTERAX_ON_ERROR_BREAKPOINT_FRAMES", "many")
    f = jax.jit(lambda x: fx.error_if(x, x > 0, "bad", on_error="breakpoint"))
    with pytest.raises(ValueError, match="FILTERAX_ON_ERROR_BREAKPOINT_FRAMES='many'"):
        f(jnp.array(1.0))


def test_a_failure_under_jax_jit_is_translated_by_runtime_error_from():
    f = jax.jit(sqrt_of_non_negative)
    f(jnp.array(1.0))
    # JAX's C++ dispatch may report a failure on a cache hit as a ValueError.
    with pytest.raises((ValueError, jax.errors.JaxRuntimeError)) as info:
        f(jnp.array(-1.0))
    translated = runtime_error_from(info.value)
    assert isinstance(translated, fx.FilteraxRuntimeError)
    assert "x must be non-negative" in str(translated)


def test_a_check_failing_at_trace_time_raises_the_tracetime_error():
    # Equinox code catches `EquinoxTracetimeError`; filterax's own
    # `except FilteraxRuntimeError` catches it too.
    assert fx.EquinoxTracetimeError is fx.FilteraxTracetimeError
    assert issubclass(fx.FilteraxTracetimeError, fx.FilteraxRuntimeError)
    with pytest.raises(fx.EquinoxTracetimeError, match="known at once"):
        fx.error_if(jnp.ones(2), True, "known at once")
    with pytest.raises(fx.EquinoxTracetimeError, match="second"):
        fx.branched_error_if(jnp.ones(2), True, 1, ["first", "second"])
    failing = fx.filter_jit(lambda x: fx.error_if(x, x > 0, "at run time"))
    with pytest.raises(fx.FilteraxRuntimeError, match="at run time") as info:
        failing(jnp.ones(2))
    assert not isinstance(info.value, fx.FilteraxTracetimeError)
    # A concrete array is checked as the program runs, eagerly too (Equinox).
    with pytest.raises(fx.FilteraxRuntimeError, match="second") as info:
        fx.branched_error_if(jnp.ones(2), jnp.array(True), 1, ["first", "second"])
    assert not isinstance(info.value, fx.FilteraxTracetimeError)


def test_a_concrete_array_predicate_fails_only_where_the_check_runs():
    # As in Equinox: the check is staged, so a branch that is not taken, or a
    # loop body that never runs, never fails.
    failed = jnp.array(True)

    def guarded(x):
        return fx.error_if(x, failed, "never reached")

    x = jnp.arange(2.0)
    out = jax.jit(lambda x: lax.cond(False, guarded, lambda x: x + 1, x))(x)
    np.testing.assert_array_equal(out, x + 1)
    out = jax.jit(lambda x: lax.while_loop(lambda c: False, guarded, x))(x)
    np.testing.assert_array_equal(out, x)
    with pytest.raises(fx.FilteraxRuntimeError, match="never reached"):
        fx.filter_jit(lambda x: lax.cond(True, guarded, lambda x: x + 1, x))(x)
    # "nan" fills at run time, without the trace-time warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        filled = jax.jit(lambda x: fx.error_if(x, failed, "m", on_error="nan"))(x)
    assert jnp.isnan(filled).all()
