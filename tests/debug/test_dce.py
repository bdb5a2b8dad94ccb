"""`store_dce` and `inspect_dce`: which stored arrays the compiler removed."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from filterax.debug import inspect_dce, store_dce


def test_reports_used_arrays_and_removed_ones(capsys):
    @jax.jit
    def f(x):
        kept, removed, label = store_dce((x * 2, x + 1, "label"), name="basic")
        return kept

    f(jnp.ones(3))
    capsys.readouterr()
    inspect_dce("basic")
    assert capsys.readouterr().out == (
        "Found 1 call to `filterax.debug.store_dce`.\n"
        "Entry 0:\n"
        "(f32[3], <DCE'd>, 'label')\n"
    )


def test_values_pass_through_unchanged():
    @jax.jit
    def f(x):
        return store_dce({"y": x + 1}, name="values")["y"]

    assert f(jnp.arange(3.0)).tolist() == [1.0, 2.0, 3.0]


def test_every_trace_makes_an_entry(capsys):
    @jax.jit
    def f(x):
        return store_dce(x, name="retraced")

    f(jnp.ones(2))
    f(jnp.ones((2, 2), jnp.int32))
    capsys.readouterr()
    inspect_dce("retraced")
    printed = capsys.readouterr().out
    assert "Found 2 calls" in printed
    assert "Entry 0:\nf32[2]" in printed and "Entry 1:\ni32[2,2]" in printed


def test_an_entry_shows_removed_until_the_program_runs(capsys):
    @jax.jit
    def f(x):
        return store_dce(x, name="not run")

    f.lower(jnp.ones(2))
    capsys.readouterr()
    inspect_dce("not run")
    assert capsys.readouterr().out.endswith("Entry 0:\n<DCE'd>\n")


def test_names_keep_entries_apart(capsys):
    @jax.jit
    def f(x):
        return store_dce(x, name="first") + store_dce(x, name="second")

    f(jnp.ones(()))
    capsys.readouterr()
    inspect_dce("first")
    assert "Found 1 call" in capsys.readouterr().out


def test_key_arrays_are_tracked():
    @jax.jit
    def f(key):
        return jax.random.normal(store_dce(key, name="keys"), (2,))

    assert f(jax.random.key(0)).shape == (2,)


def test_store_dce_outside_of_jit_is_an_error():
    with pytest.raises(RuntimeError, match="inside a JIT"):
        store_dce(jnp.ones(2))


def test_inspect_dce_inside_of_jit_is_an_error():
    @jax.jit
    def f(x):
        inspect_dce()
        return x

    with pytest.raises(RuntimeError, match="outside of JIT"):
        f(jnp.ones(2))
