"""Treescope display of filterax objects (`filterax/_treescope.py`).

Each test renders a value to HTML with `treescope.render_to_html`, as a notebook
would, and reads the text a user sees (tags stripped): field names, entry
names and array summaries (dtype and shape).
"""

from __future__ import annotations

import html
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import treescope

import filterax as fx
from filterax import nn


def shown(value: object) -> str:
    """The text of `value`'s treescope HTML, tags stripped and whitespace
    collapsed: it holds the folded and unfolded forms side by side."""
    page = treescope.render_to_html(value, compressed=False)
    page = re.sub(r"<(style|script)\b.*?</\1>", "", page, flags=re.S)
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    return " ".join(text.split())


class Linear(fx.Module):
    weight: jax.Array
    bias: jax.Array
    frozen: fx.NonDifferentiable
    name: str = fx.field(static=True, default="linear")
    hidden: int = fx.field(default=0, repr=False)


def make_linear() -> Linear:
    return Linear(jnp.ones((4, 2)), jnp.zeros(4), fx.NonDifferentiable(jnp.ones(3)))


def test_import_filterax_does_not_import_treescope() -> None:
    code = "import sys, filterax; print('treescope' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_a_module_shows_its_repr_fields_by_name_with_array_summaries() -> None:
    text = shown(make_linear())
    assert "Linear(" in text
    assert "weight=" in text and "float32(4, 2)" in text
    assert "bias=" in text
    assert "name='linear'" in text
    assert "hidden=" not in text  # repr=False, as in its repr


def test_non_differentiable_shows_its_value() -> None:
    text = shown(fx.NonDifferentiable(jnp.zeros((2, 3))))
    assert "NonDifferentiable(" in text
    assert "value=" in text and "float32(2, 3)" in text


def test_a_module_holding_non_differentiable_shows_it_by_field() -> None:
    text = shown(make_linear())
    assert "frozen=" in text and "NonDifferentiable(value=" in text


def test_symbolic_zero_shows_shape_and_dtype() -> None:
    text = shown(fx.SymbolicZero((2, 5), jnp.float32))
    assert "SymbolicZero(" in text
    assert "shape=(2, 5" in text and "dtype=" in text and "float32" in text


def test_state_shows_its_entries_by_name() -> None:
    _, state = nn.make_with_state(nn.BatchNorm)(3, "batch", mode="batch")
    text = shown(state)
    assert "State(" in text
    assert "BatchNorm.batch_counter=" in text
    assert "BatchNorm.batch_state_index=" in text
    assert "float32(3,)" in text or "[0., 0., 0.]" in text


def test_a_ref_shows_its_current_value() -> None:
    class Counter(fx.Module):
        count: jax.Ref

    counter = Counter(jax.new_ref(jnp.zeros((5, 5))))
    text = shown(counter)
    assert "count=Ref(" in text and "float32(5, 5)" in text
    counter.count[...] = jnp.ones((5, 5))
    assert "≈1.0" in shown(counter)  # the value now, not at construction


def test_typed_keys_show_their_implementation_shape_and_data() -> None:
    text = shown(fx.RngStream(jax.random.key(0)))
    assert "key=key<fry>[](" in text and "key_data=" in text
    assert "count=Ref(" in text
    keys = shown({"keys": jax.random.split(jax.random.key(1), 3)})
    assert "key<fry>[3](" in keys and "uint32(3, 2)" in keys


def test_nn_layers_show_their_fields() -> None:
    key = jax.random.key(0)
    model = nn.Sequential(
        [
            nn.Conv2d(1, 4, kernel_size=3, key=key),
            nn.Dropout(0.1),
            nn.Lambda(jax.nn.relu),
        ]
    )
    text = shown(model)
    assert "Sequential(" in text
    assert "Conv2d(" in text and "weight=" in text and "float32(4, 1, 3, 3)" in text
    assert "Dropout(p=0.1" in text and "inference=False" in text
    assert "fn=" in text and "relu" in text
    mlp = shown(nn.MLP(2, 3, 4, 1, key=key))
    assert "layers=(" in mlp and "float32(4, 2)" in mlp and "activation=" in mlp


def test_classes_show_under_their_public_names_in_roundtrip_mode() -> None:
    layer = nn.Linear(2, 3, key=jax.random.key(0))
    text = treescope.render_to_text(layer, roundtrip_mode=True)
    assert text.startswith("<filterax.nn.Linear(")


def test_types_that_are_not_modules_show_alone_before_any_module_is_shown() -> None:
    # A fresh process: nothing has imported `filterax._treescope` yet, and the
    # values are shown on their own or in plain containers, never in a Module.
    code = """
import html, re, sys
import jax, jax.numpy as jnp, treescope
import filterax as fx
from filterax import nn

def shown(value):
    page = treescope.render_to_html(value, compressed=False)
    page = re.sub(r"<(style|script)\\b.*?</\\1>", "", page, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", page)).split())

assert "filterax._treescope" not in sys.modules
print(shown(jax.random.split(jax.random.key(1), 3)))
_, state = nn.make_with_state(nn.BatchNorm)(3, "batch", mode="batch")
print(shown(state))
print(shown(fx.NonDifferentiable(jnp.zeros((2, 3)))))
print(shown(fx.SymbolicZero((2, 5), jnp.float32)))
print(shown({"frozen": [fx.NonDifferentiable(jnp.ones(4))], "state": state}))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    keys, state, frozen, zero, nested = result.stdout.splitlines()
    assert "State(" in state and "BatchNorm.batch_counter=" in state
    assert "NonDifferentiable(" in frozen and "value=" in frozen
    assert "float32(2, 3)" in frozen
    assert "SymbolicZero(" in zero and "shape=(2, 5" in zero and "float32" in zero
    # Inside containers, small trees show folded, with their values.
    assert "NonDifferentiable(value=" in nested and "[1., 1., 1., 1.]" in nested
    assert "State(BatchNorm.batch_counter=" in nested
    assert "BatchNorm.batch_state_index=" in nested
    for text in (state, frozen, zero, nested):
        assert "PyTree children" not in text  # not treescope's generic view
    # Typed keys are JAX arrays, which treescope summarises itself until
    # `filterax._treescope` is imported (then `key<fry>[3](key_data=...)`).
    assert "key<fry>(3,)" in keys
