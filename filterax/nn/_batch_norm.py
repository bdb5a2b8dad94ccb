"""`BatchNorm`."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Inexact, Int, PRNGKeyArray

from .._module import field
from .._sharding import axes_overrides_field, declared_axes, layer_axes
from .._warnings import FilteraxWarning, warn_at_caller
from ._sequential import StatefulLayer
from ._shared_helpers import default_floating_dtype, statistics_dtype
from ._stateful import State, StateIndex

__all__ = ["BatchNorm"]

_Statistics = tuple[Inexact[Array, " input_size"], Inexact[Array, " input_size"]]


class BatchNorm(StatefulLayer):
    r"""Batch normalisation: normalises each channel by the mean and variance of
    that channel over the batch (and every spatial position).

    The batch is the axis named `axis_name` of the surrounding `jax.vmap` /
    [`filter_vmap`][filterax.filter_vmap]: call the layer on one example
    `x` of shape `(input_size, *spatial)` inside a map with that axis name.
    In training the batch statistics normalise `x` and update running
    statistics kept in a [`State`][filterax.nn.State]; in inference the
    running statistics normalise it, and the state is returned unchanged.

    - `mode="ema"`: the running statistics are an exponential moving average,
      `momentum * running + (1 - momentum) * batch`, started from the first
      batch's statistics. Training normalises with these averaged statistics.
    - `mode="batch"`: training normalises with the batch statistics. The
      running statistics average them as above but start from zero mean and
      unit variance; inference divides them by `1 - momentum ** steps` to
      remove the bias of that start (and uses them as they are before any
      training step).

    The output is `(x - mean) / sqrt(var + eps)`, then `* weight + bias` when
    `channelwise_affine`. The statistics and the normalisation are computed in
    at least float32 whatever `x`'s dtype (bfloat16 and float16 inputs are
    upcast), the running statistics are stored in their own dtype, and the
    output has `x`'s dtype.

    **Arguments:**

    - `input_size`: the number of channels (the length of `x`'s first axis).
    - `axis_name`: the name of the batch axis, or a sequence of names to
      normalise over several nested maps.
    - `eps`: added to the variance, for numerical stability.
    - `channelwise_affine`: whether to learn a per-channel scale `weight`
      (initially one) and shift `bias` (initially zero).
    - `momentum`: the weight of the past in the running statistics.
    - `inference`: whether to use the running statistics (see
      [`inference_mode`][filterax.nn.inference_mode]).
    - `dtype`: the dtype of the parameters and running statistics. Defaults to
      `float32`, or `float64` when `jax_enable_x64` is on.
    - `mode`: `"ema"` or `"batch"`, as above. The default, `"legacy"` (as in
      Equinox's signature), means `"ema"`, with a warning that recommends
      choosing (`"batch"` for new code); `None` means the same.
    - `axes`: logical axes replacing the defaults for this layer, by field name
      (keyword only). `weight`, `bias` and the running statistics
      (`ema_state_index`, `batch_state_index`: their arrays, in the model's
      `State` too) default to `("channel",)`; see
      [`sharding_of`][filterax.sharding_of].

    **Returns:** the layer. Build it with
    [`make_with_state`][filterax.nn.make_with_state] to get its state.

    **Raises:** `ValueError` for an unknown `mode`, or for `axes` naming another
    field or giving the wrong number of names.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> bn, state = fx.nn.make_with_state(fx.nn.BatchNorm)(2, "batch", mode="batch")
    >>> x = jnp.array([[0.0, 10.0], [2.0, 30.0]])
    >>> train = jax.vmap(bn, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
    >>> y, state = train(x, state)
    >>> bool(jnp.allclose(y, jnp.array([[-1.0, -1.0], [1.0, 1.0]]), atol=1e-4))
    True
    >>> mean, var = state.get(bn.batch_state_index)  # 0.99 * 0 + 0.01 * batch mean
    >>> bool(jnp.allclose(mean, jnp.array([0.01, 0.2])))
    True

    ```
    """

    weight: Inexact[Array, " input_size"] | None = field(axes=("channel",))
    bias: Inexact[Array, " input_size"] | None = field(axes=("channel",))
    ema_first_time_index: StateIndex[Bool[Array, ""]] | None
    ema_state_index: StateIndex[_Statistics] | None = field(axes=("channel",))
    batch_counter: StateIndex[Int[Array, ""]] | None
    batch_state_index: StateIndex[_Statistics] | None = field(axes=("channel",))
    axis_name: Hashable | Sequence[Hashable]
    inference: bool
    input_size: int = field(static=True)
    eps: float = field(static=True)
    channelwise_affine: bool = field(static=True)
    momentum: float = field(static=True)
    mode: Literal["ema", "batch"] = field(static=True)
    axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = axes_overrides_field()

    def __init__(
        self,
        input_size: int,
        axis_name: Hashable | Sequence[Hashable],
        eps: float = 1e-5,
        channelwise_affine: bool = True,
        momentum: float = 0.99,
        inference: bool = False,
        dtype: Any = None,
        mode: Literal["ema", "batch", "legacy"] | None = "legacy",
        *,
        axes: dict[str, tuple[str | None, ...]] | None = None,
    ):
        self.axes = layer_axes("BatchNorm", axes, declared_axes(type(self)))
        if mode is None or mode == "legacy":  # Equinox's default: "not chosen"
            warn_at_caller(
                "BatchNorm(mode=...) was not given, so it is 'ema' (the historical "
                "default). 'batch' normalises with the statistics of the batch "
                "itself and is usually the better choice for new code; pass "
                "mode='ema' or mode='batch' to choose and silence this warning.",
                FilteraxWarning,
                stacklevel=2,
            )
            mode = "ema"
        if mode not in ("ema", "batch"):
            raise ValueError(
                f"BatchNorm: `mode` must be 'ema' or 'batch', got {mode!r}."
            )
        dtype = default_floating_dtype() if dtype is None else dtype
        if channelwise_affine:
            self.weight = jnp.ones((input_size,), dtype)
            self.bias = jnp.zeros((input_size,), dtype)
        else:
            self.weight = None
            self.bias = None
        self.ema_first_time_index = None
        self.ema_state_index = None
        self.batch_counter = None
        self.batch_state_index = None
        if mode == "ema":
            self.ema_first_time_index = StateIndex(jnp.array(True))
            self.ema_state_index = StateIndex(
                (jnp.zeros((input_size,), dtype), jnp.zeros((input_size,), dtype))
            )
        else:
            self.batch_counter = StateIndex(jnp.zeros((), int))
            self.batch_state_index = StateIndex(
                (jnp.zeros((input_size,), dtype), jnp.ones((input_size,), dtype))
            )
        self.axis_name = axis_name
        self.inference = inference
        self.input_size = input_size
        self.eps = eps
        self.channelwise_affine = channelwise_affine
        self.momentum = momentum
        self.mode = mode

    def _batch_statistics(self, x: Array) -> _Statistics:
        """Per channel, the mean and (biased) variance over every position of
        every example in the batch."""

        def statistics(channel: Array) -> tuple[Array, Array]:
            mean = _batch_mean(jnp.mean(channel), self.axis_name)
            # `channel - mean` twice, not once: the same operations as
            # Equinox's, so that gradients agree to the last bit (Adam turns
            # rounding noise on a zero gradient into a full step).
            squares = (channel - mean) * jnp.conj(channel - mean)
            var = _batch_mean(jnp.mean(squares), self.axis_name)
            return mean, jnp.maximum(0.0, var)

        return jax.vmap(statistics)(x)

    def __call__(
        self,
        x: Array,
        state: State,
        *,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
    ) -> tuple[Array, State]:
        """Normalises one example and, in training, updates the running
        statistics.

        **Arguments:**

        - `x`: one example, of shape `(input_size, *spatial)`.
        - `state`: the layer's [`State`][filterax.nn.State].
        - `key`: ignored.
        - `inference`: overrides the layer's `inference` flag for this call.

        **Returns:** `(y, state)`: `y` like `x`, and the new state.

        **Raises:** `ValueError` when `x`'s first axis is not `input_size`;
        `NameError` when called outside a map over `axis_name`.

        ```python
        >>> import jax, jax.numpy as jnp
        >>> import filterax as fx
        >>> bn, state = fx.nn.make_with_state(fx.nn.BatchNorm)(1, "b", mode="ema")
        >>> x = jnp.array([[1.0], [3.0]])
        >>> run = jax.vmap(bn, axis_name="b", in_axes=(0, None), out_axes=(0, None))
        >>> y, state = run(x, state)
        >>> mean, var = state.get(bn.ema_state_index)
        >>> mean.tolist(), var.tolist()
        ([2.0], [1.0])

        ```
        """
        del key
        if jnp.ndim(x) == 0 or jnp.shape(x)[0] != self.input_size:
            raise ValueError(
                f"BatchNorm(input_size={self.input_size}) expects one example of "
                f"shape ({self.input_size}, ...), got shape {jnp.shape(x)}; the batch "
                f"axis is mapped over by jax.vmap(..., axis_name={self.axis_name!r})."
            )
        if inference is None:
            inference = self.inference
        # Statistics in at least float32: a float16 variance overflows and a
        # bfloat16 mean loses the small differences normalisation is about.
        # (For float32 inputs both casts are no-ops.)
        x_dtype = jnp.result_type(x)
        x = jnp.asarray(x, statistics_dtype(x_dtype))
        if self.mode == "ema":
            mean, var, state = self._ema(x, state, inference)
        else:
            mean, var, state = self._batch(x, state, inference)
        out = jax.vmap(self._normalise)(x, mean, var, self.weight, self.bias)
        return out.astype(x_dtype), state

    def _ema(self, x: Array, state: State, inference: bool) -> tuple[Any, Any, State]:
        assert self.ema_first_time_index is not None
        assert self.ema_state_index is not None
        stored_mean, stored_var = state.get(self.ema_state_index)
        running_mean, running_var = _in_dtype_of(x, stored_mean, stored_var)
        if inference:
            return running_mean, running_var, state
        first_time = state.get(self.ema_first_time_index)
        state = state.set(self.ema_first_time_index, jnp.array(False))
        batch_mean, batch_var = self._batch_statistics(x)
        m = self.momentum
        mean = jnp.where(
            first_time, batch_mean, (1 - m) * batch_mean + m * running_mean
        )
        var = jnp.where(first_time, batch_var, (1 - m) * batch_var + m * running_var)
        state = state.set(
            self.ema_state_index,
            (mean.astype(stored_mean.dtype), var.astype(stored_var.dtype)),
        )
        return mean, var, state

    def _batch(self, x: Array, state: State, inference: bool) -> tuple[Any, Any, State]:
        assert self.batch_counter is not None
        assert self.batch_state_index is not None
        steps = state.get(self.batch_counter)
        stored_mean, stored_var = state.get(self.batch_state_index)
        running_mean, running_var = _in_dtype_of(x, stored_mean, stored_var)
        m = self.momentum
        if inference:
            # The running averages started from (0, 1); dividing by the total
            # weight the batches got, 1 - m**steps, removes that start's bias.
            total = jnp.where(steps == 0, 1, 1 - m**steps)
            return running_mean / total, running_var / total, state
        mean, var = self._batch_statistics(x)
        state = state.set(self.batch_counter, steps + 1)
        new_mean = m * running_mean + (1 - m) * mean
        new_var = m * running_var + (1 - m) * var
        state = state.set(
            self.batch_state_index,
            (new_mean.astype(stored_mean.dtype), new_var.astype(stored_var.dtype)),
        )
        return mean, var, state

    def _normalise(
        self, channel: Array, mean: Array, var: Array, weight: Any, bias: Any
    ) -> Array:
        out = (channel - mean) / jnp.sqrt(var + self.eps)
        if self.channelwise_affine:
            out = out * weight.astype(out.dtype) + bias.astype(out.dtype)
        return out


def _in_dtype_of(x: Array, *arrays: Array) -> tuple[Array, ...]:
    """`arrays` (running statistics, stored in the parameters' dtype) cast to
    `x`'s dtype, the statistics dtype: no-ops when they already agree."""
    return tuple(jnp.asarray(a, x.dtype) for a in arrays)


def _batch_mean(value: Array, axis_name: Any) -> Array:
    try:
        return jax.lax.pmean(value, axis_name)
    except NameError as error:
        raise NameError(
            f"BatchNorm(axis_name={axis_name!r}) averages over the batch axis of "
            f"that name, which is not bound here ({error}). Call the layer inside "
            f"jax.vmap(..., axis_name={axis_name!r}) or filterax.filter_vmap(..., "
            f"axis_name={axis_name!r})."
        ) from error
