"""`breakpoint_if`: JAX's debugger, opened only when the predicate is true."""

from __future__ import annotations

import io
import sys

import jax
import jax.numpy as jnp
import pytest

from filterax.debug import breakpoint_if


class _NoInput(io.TextIOBase):
    """A standard input that fails the test if anything reads it."""

    def readline(self, size: int = -1) -> str:
        raise AssertionError("the debugger opened")

    def read(self, size: int | None = -1) -> str:
        raise AssertionError("the debugger opened")


def scaled(x):
    doubled = 2 * x
    return breakpoint_if(doubled > 10, token=doubled) + 1


def test_a_false_predicate_never_opens_the_debugger(monkeypatch):
    monkeypatch.setattr(sys, "stdin", _NoInput())
    assert float(jax.jit(scaled)(jnp.array(1.0))) == 3.0
    jax.effects_barrier()


def test_the_compiled_program_guards_the_debugger_with_a_branch():
    jaxpr = str(jax.make_jaxpr(scaled)(jnp.array(1.0)))
    before_branch, branch = jaxpr.split("cond[", 1)
    assert "callback" not in before_branch
    assert "callback" in branch


def test_a_true_predicate_opens_the_debugger_at_the_callers_frame(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("u\n" * 10 + "p doubled\nc\n"))
    assert float(jax.jit(scaled)(jnp.array(6.0))) == 13.0
    jax.effects_barrier()
    printed = capsys.readouterr().out
    assert "Entering jdb" in printed
    assert "Array(12., dtype=float32" in printed


def test_under_vmap_it_opens_once_if_any_element_is_true(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("c\n"))
    out = jax.vmap(scaled)(jnp.array([1.0, 6.0, 7.0]))
    jax.effects_barrier()
    assert out.tolist() == [3.0, 13.0, 15.0]
    assert capsys.readouterr().out.count("Entering jdb") == 1


def test_under_vmap_a_false_predicate_never_opens_the_debugger(monkeypatch):
    monkeypatch.setattr(sys, "stdin", _NoInput())
    out = jax.jit(jax.vmap(scaled))(jnp.array([1.0, 2.0]))
    assert out.tolist() == [3.0, 5.0]


def test_without_a_token_it_returns_none(monkeypatch):
    monkeypatch.setattr(sys, "stdin", _NoInput())
    assert breakpoint_if(jnp.array(False)) is None


def test_gradients_flow_through_the_token():
    gradient = jax.grad(lambda x: scaled(x))(jnp.array(1.0))
    assert float(gradient) == 2.0


def test_a_non_boolean_predicate_is_rejected():
    with pytest.raises(TypeError, match="boolean"):
        breakpoint_if(jnp.array(1.0))
