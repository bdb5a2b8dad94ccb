"""Single steps of recurrent networks: `GRUCell`, `LSTMCell`.

A cell maps `(input, hidden)` to the next hidden state; run it over a sequence
with `jax.lax.scan`. Parameters are drawn uniformly from
`[-1/sqrt(hidden_size), 1/sqrt(hidden_size)]`.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .._module import Module, field
from .._sharding import axes_overrides_field, declared_axes, layer_axes
from ._shared_helpers import check_key, uniform_init

__all__ = ["GRUCell", "LSTMCell"]


def _check_sizes(cell: str, input_size: int, hidden_size: int) -> None:
    for name, value, least in (
        ("input_size", input_size, 0),
        ("hidden_size", hidden_size, 1),
    ):
        try:
            valid = not isinstance(value, bool) and operator.index(value) >= least
        except TypeError:
            valid = False
        if not valid:
            kind = "positive" if least else "non-negative"
            raise ValueError(f"{cell} needs a {kind} int {name}; got {value!r}.")


def _limit(hidden_size: int) -> float:
    return math.sqrt(1 / hidden_size)


def _gate_params(
    keys: Array,
    gates: int,
    input_size: int,
    hidden_size: int,
    use_bias: bool,
    dtype: Any,
) -> tuple[Array, Array, Array | None]:
    """`(weight_ih, weight_hh, bias)` of a cell with `gates` gates, drawn from
    the three `keys` in that order; `bias` is `None` unless `use_bias`."""
    ih_key, hh_key, bias_key = keys
    lim = _limit(hidden_size)
    weight_ih = uniform_init(ih_key, (gates * hidden_size, input_size), dtype, lim)
    weight_hh = uniform_init(hh_key, (gates * hidden_size, hidden_size), dtype, lim)
    bias = (
        uniform_init(bias_key, (gates * hidden_size,), dtype, lim) if use_bias else None
    )
    return weight_ih, weight_hh, bias


def _check_shape(cell: str, name: str, x: Any, size: int) -> None:
    if jnp.shape(x) != (size,):
        raise ValueError(
            f"{cell} expects `{name}` of shape ({size},); got shape {jnp.shape(x)}. "
            "Use `jax.vmap` over a batch, and `jax.lax.scan` over a sequence."
        )


class GRUCell(Module):
    """One step of a gated recurrent unit (GRU).

    With `W_ih @ input + bias` split into `(i_r, i_z, i_n)` and `W_hh @ hidden`
    into `(h_r, h_z, h_n)`, the step computes

    - reset gate `r = sigmoid(i_r + h_r)`,
    - update gate `z = sigmoid(i_z + h_z)`,
    - candidate `n = tanh(i_n + r * (h_n + bias_n))`,

    and returns `n + z * (hidden - n)`.

    **Arguments:**

    - `input_size`: the size of each input vector.
    - `hidden_size`: the size of the hidden state.
    - `use_bias`: whether to hold `bias` (shape `(3 * hidden_size,)`) and
      `bias_n` (shape `(hidden_size,)`); else both are `None`.
    - `dtype`: the dtype of every parameter; defaults to float32 (float64 when
      JAX's x64 mode is on).
    - `key`: the PRNG key for initialisation (keyword only).
    - `axes`: logical axes replacing the defaults for this cell, by field name
      (keyword only). The defaults: `weight_ih: ("gates", "in")`, `weight_hh:
      ("gates", "hidden")`, `bias: ("gates",)`, `bias_n: ("hidden",)`; see
      [`sharding_of`][filterax.sharding_of].

    **Returns:** calling the cell on `(input, hidden)` returns the next hidden
    state, of shape `(hidden_size,)`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> cell = fx.nn.GRUCell(2, 3, key=jax.random.key(0))
    >>> cell.weight_ih.shape, cell.weight_hh.shape
    ((9, 2), (9, 3))
    >>> def step(hidden, x):
    ...     return cell(x, hidden), None
    >>> final, _ = jax.lax.scan(step, jnp.zeros(3), jnp.ones((5, 2)))
    >>> final.shape
    (3,)

    ```
    """

    weight_ih: Float[Array, "3*hidden_size input_size"] = field(axes=("gates", "in"))
    weight_hh: Float[Array, "3*hidden_size hidden_size"] = field(
        axes=("gates", "hidden")
    )
    bias: Float[Array, " 3*hidden_size"] | None = field(axes=("gates",))
    bias_n: Float[Array, " hidden_size"] | None = field(axes=("hidden",))
    input_size: int = field(static=True)
    hidden_size: int = field(static=True)
    use_bias: bool = field(static=True)
    axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = axes_overrides_field()

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        use_bias: bool = True,
        dtype: Any = None,
        *,
        key: PRNGKeyArray,
        axes: dict[str, tuple[str | None, ...]] | None = None,
    ):
        self.axes = layer_axes("GRUCell", axes, declared_axes(type(self)))
        _check_sizes("GRUCell", input_size, hidden_size)
        check_key(key, "GRUCell")
        keys = jax.random.split(key, 4)
        self.weight_ih, self.weight_hh, self.bias = _gate_params(
            keys[:3], 3, input_size, hidden_size, use_bias, dtype
        )
        self.bias_n = (
            uniform_init(keys[3], (hidden_size,), dtype, _limit(hidden_size))
            if use_bias
            else None
        )
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.use_bias = use_bias

    def __call__(
        self,
        input: Float[Array, " input_size"],
        hidden: Float[Array, " hidden_size"],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, " hidden_size"]:
        """One step.

        **Arguments:**

        - `input`: an array of shape `(input_size,)`.
        - `hidden`: the hidden state, of shape `(hidden_size,)`.
        - `key`: ignored (keyword only).

        **Returns:** the next hidden state, of shape `(hidden_size,)`.
        """
        _check_shape("GRUCell", "input", input, self.input_size)
        _check_shape("GRUCell", "hidden", hidden, self.hidden_size)
        input_part = self.weight_ih @ input
        if self.bias is not None:
            input_part = input_part + self.bias
        i_r, i_z, i_n = jnp.split(input_part, 3)
        h_r, h_z, h_n = jnp.split(self.weight_hh @ hidden, 3)
        if self.bias_n is not None:
            h_n = h_n + self.bias_n
        reset = jax.nn.sigmoid(i_r + h_r)
        update = jax.nn.sigmoid(i_z + h_z)
        candidate = jnp.tanh(i_n + reset * h_n)
        return candidate + update * (hidden - candidate)


class LSTMCell(Module):
    """One step of a long short-term memory unit (LSTM).

    With `W_ih @ input + W_hh @ h + bias` split into `(a_i, a_f, a_g, a_o)`, the
    step computes the gates `i = sigmoid(a_i)`, `f = sigmoid(a_f)`,
    `o = sigmoid(a_o)` and the candidate `g = tanh(a_g)`, then
    `c' = f * c + i * g` and `h' = o * tanh(c')`.

    **Arguments:**

    - `input_size`: the size of each input vector.
    - `hidden_size`: the size of the hidden state `h` and the cell state `c`.
    - `use_bias`: whether to hold `bias` (shape `(4 * hidden_size,)`); else it
      is `None`.
    - `dtype`: the dtype of every parameter; defaults to float32 (float64 when
      JAX's x64 mode is on).
    - `key`: the PRNG key for initialisation (keyword only).
    - `axes`: logical axes replacing the defaults for this cell, by field name
      (keyword only). The defaults: `weight_ih: ("gates", "in")`, `weight_hh:
      ("gates", "hidden")`, `bias: ("gates",)`; see
      [`sharding_of`][filterax.sharding_of].

    **Returns:** calling the cell on `(input, (h, c))` returns the next state
    `(h', c')`, each of shape `(hidden_size,)`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> cell = fx.nn.LSTMCell(2, 3, key=jax.random.key(0))
    >>> h, c = cell(jnp.ones(2), (jnp.zeros(3), jnp.zeros(3)))
    >>> h.shape, c.shape
    ((3,), (3,))

    ```
    """

    weight_ih: Float[Array, "4*hidden_size input_size"] = field(axes=("gates", "in"))
    weight_hh: Float[Array, "4*hidden_size hidden_size"] = field(
        axes=("gates", "hidden")
    )
    bias: Float[Array, " 4*hidden_size"] | None = field(axes=("gates",))
    input_size: int = field(static=True)
    hidden_size: int = field(static=True)
    use_bias: bool = field(static=True)
    axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = axes_overrides_field()

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        use_bias: bool = True,
        dtype: Any = None,
        *,
        key: PRNGKeyArray,
        axes: dict[str, tuple[str | None, ...]] | None = None,
    ):
        self.axes = layer_axes("LSTMCell", axes, declared_axes(type(self)))
        _check_sizes("LSTMCell", input_size, hidden_size)
        check_key(key, "LSTMCell")
        self.weight_ih, self.weight_hh, self.bias = _gate_params(
            jax.random.split(key, 3), 4, input_size, hidden_size, use_bias, dtype
        )
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.use_bias = use_bias

    def __call__(
        self,
        input: Float[Array, " input_size"],
        hidden: tuple[Float[Array, " hidden_size"], Float[Array, " hidden_size"]],
        *,
        key: PRNGKeyArray | None = None,
    ) -> tuple[Float[Array, " hidden_size"], Float[Array, " hidden_size"]]:
        """One step.

        **Arguments:**

        - `input`: an array of shape `(input_size,)`.
        - `hidden`: the state `(h, c)`, each of shape `(hidden_size,)`.
        - `key`: ignored (keyword only).

        **Returns:** the next state `(h, c)`, each of shape `(hidden_size,)`.
        """
        try:
            h, c = hidden
        except (TypeError, ValueError):
            raise ValueError(
                "LSTMCell expects `hidden` to be a pair `(h, c)` of arrays of shape "
                f"({self.hidden_size},); got {type(hidden).__name__}."
            ) from None
        _check_shape("LSTMCell", "input", input, self.input_size)
        _check_shape("LSTMCell", "h", h, self.hidden_size)
        _check_shape("LSTMCell", "c", c, self.hidden_size)
        pre_activation = self.weight_ih @ input + self.weight_hh @ h
        if self.bias is not None:
            pre_activation = pre_activation + self.bias
        a_i, a_f, a_g, a_o = jnp.split(pre_activation, 4)
        c = jax.nn.sigmoid(a_f) * c + jax.nn.sigmoid(a_i) * jnp.tanh(a_g)
        h = jax.nn.sigmoid(a_o) * jnp.tanh(c)
        return h, c
