"""`StatefulLayer` (the base of layers that read and write a `State`),
`Sequential` and `Lambda`."""

from __future__ import annotations

import abc
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any, SupportsIndex, overload

import jax
from jaxtyping import Array, PRNGKeyArray

from .._module import Module
from .._rng import RngStream
from ._shared_helpers import NO_STATE
from ._stateful import State

__all__ = ["Lambda", "Sequential", "StatefulLayer"]


class StatefulLayer(Module):
    """The base class of layers that take and return a
    [`State`][filterax.nn.State]: `layer(x, state, *, key=None) -> (y, state)`.

    [`Sequential`][filterax.nn.Sequential] threads the state through the layers
    whose `is_stateful()` is true and calls the others as `layer(x, key=key)`.
    A subclass defines `__call__`, and may override `is_stateful` to decide per
    instance (as `Sequential` itself does).

    **Arguments:** those of the subclass.

    **Returns:** an instance of the subclass.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> class Count(fx.nn.StatefulLayer):
    ...     index: fx.nn.StateIndex
    ...     def __init__(self):
    ...         self.index = fx.nn.StateIndex(jnp.array(0))
    ...     def __call__(self, x, state, *, key=None):
    ...         return x, state.set(self.index, state.get(self.index) + 1)
    >>> model, state = fx.nn.make_with_state(fx.nn.Sequential)([Count(), Count()])
    >>> model.is_stateful()
    True
    >>> _, state = model(jnp.zeros(2), state)
    >>> [int(state.get(layer.index)) for layer in model]
    [1, 1]

    ```
    """

    @abc.abstractmethod
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """`(x, state, *, key=None) -> (y, new_state)`, for a subclass to define."""

    def is_stateful(self) -> bool:
        """Whether this layer takes and returns a `State` when called.

        **Returns:** `True` for a `StatefulLayer` unless a subclass says
        otherwise.

        ```python
        >>> import filterax as fx
        >>> fx.nn.Sequential([fx.nn.Identity()]).is_stateful()
        False

        ```
        """
        return True


def _layer_keys(key: Any, count: int) -> list[Any]:
    if key is None:
        return [None] * count
    if isinstance(key, RngStream):
        # Each layer draws from the stream when (and only when) it needs a key.
        return [key] * count
    return list(jax.random.split(key, count))


class Sequential(StatefulLayer):
    """Calls layers one after the other.

    The key, if any, is split into one key per layer (an
    [`RngStream`][filterax.RngStream] is passed to every layer as it is). A
    [`State`][filterax.nn.State], if given, is threaded through the stateful
    layers (see [`StatefulLayer`][filterax.nn.StatefulLayer]).

    **Arguments:**

    - `layers`: a sequence of callables, each called as `layer(x, key=key)` (or
      `layer(x, state=state, key=key)` when stateful).

    **Returns:** the layer. It supports `len`, iteration, indexing with an int
    (a layer) and with a slice (a `Sequential` of those layers).

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> k1, k2 = jax.random.split(jax.random.key(0))
    >>> model = fx.nn.Sequential([
    ...     fx.nn.Linear(2, 4, key=k1), fx.nn.Lambda(jax.nn.relu), fx.nn.Linear(4, 1, key=k2)
    ... ])
    >>> model(jnp.ones(2)).shape
    (1,)
    >>> len(model), type(model[0]).__name__, len(model[1:])
    (3, 'Linear', 2)

    ```
    """

    layers: tuple[Callable[..., Any], ...]

    def __init__(self, layers: Sequence[Callable[..., Any]]):
        layers = tuple(layers)
        for position, layer in enumerate(layers):
            if not callable(layer):
                raise TypeError(
                    "Sequential takes a sequence of callables (layers); the layer at "
                    f"position {position} is {layer!r}."
                )
        self.layers = layers

    def is_stateful(self) -> bool:
        """Whether any of the layers is stateful.

        **Returns:** `True` when some layer is a
        [`StatefulLayer`][filterax.nn.StatefulLayer] whose `is_stateful()` is
        true.

        ```python
        >>> import filterax as fx
        >>> fx.nn.Sequential([fx.nn.BatchNorm(3, "batch", mode="batch")]).is_stateful()
        True

        ```
        """
        return any(
            isinstance(layer, StatefulLayer) and layer.is_stateful()
            for layer in self.layers
        )

    @overload
    def __call__(
        self, x: Array, *, key: PRNGKeyArray | RngStream | None = None
    ) -> Array: ...

    @overload
    def __call__(
        self, x: Array, state: State, *, key: PRNGKeyArray | RngStream | None = None
    ) -> tuple[Array, State]: ...

    def __call__(
        self,
        x: Any,
        state: Any = NO_STATE,
        *,
        key: Any = None,
    ) -> Any:
        """Applies the layers in order.

        **Arguments:**

        - `x`: the input of the first layer.
        - `state`: the [`State`][filterax.nn.State] of the stateful layers, if
          there are any.
        - `key`: a PRNG key, split between the layers, or an
          [`RngStream`][filterax.RngStream], shared by them; or `None`.

        **Returns:** the output of the last layer, and the new state when
        `state` was given: `(y, state)`.

        ```python
        >>> import jax.numpy as jnp
        >>> import filterax as fx
        >>> fx.nn.Sequential([fx.nn.Lambda(jnp.sin), fx.nn.Lambda(jnp.cos)])(0.0).item()
        1.0

        ```
        """
        for layer, layer_key in zip(self.layers, _layer_keys(key, len(self.layers))):
            if isinstance(layer, StatefulLayer) and layer.is_stateful():
                x, state = layer(x, state=state, key=layer_key)
            else:
                x = layer(x, key=layer_key)
        if state is NO_STATE:
            return x
        return x, state

    @overload
    def __getitem__(self, index: SupportsIndex) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> Sequential: ...

    def __getitem__(self, index: SupportsIndex | slice) -> Any:
        if isinstance(index, slice):
            return Sequential(self.layers[index])
        try:
            position = operator.index(index)
        except TypeError:
            raise TypeError(
                "Sequential can be indexed with an int (one layer) or a slice (a "
                f"Sequential of those layers), not {type(index).__name__}."
            ) from None
        return self.layers[position]

    def __iter__(self) -> Iterator[Callable[..., Any]]:
        return iter(self.layers)

    def __len__(self) -> int:
        return len(self.layers)


class Lambda(Module):
    """Wraps a function as a layer, for example an activation in a
    [`Sequential`][filterax.nn.Sequential].

    **Arguments:**

    - `fn`: a function of one argument. If it is a Module its arrays are
      parameters of the model; a plain function is static.

    **Returns:** the layer; calling it with `(x, *, key=None)` returns `fn(x)`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> fx.nn.Lambda(jax.nn.relu)(jnp.array([-1.0, 2.0])).tolist()
    [0.0, 2.0]

    ```
    """

    fn: Callable[..., Any]

    def __init__(self, fn: Callable[..., Any]):
        if not callable(fn):
            raise TypeError(f"Lambda takes a callable, got {fn!r}.")
        self.fn = fn

    def __call__(self, x: Any, *, key: Any = None) -> Any:
        """Returns `fn(x)`; `key` is ignored.

        **Arguments:**

        - `x`: the input.
        - `key`: ignored.

        **Returns:** `fn(x)`.

        ```python
        >>> import filterax as fx
        >>> fx.nn.Lambda(abs)(-3)
        3

        ```
        """
        del key
        return self.fn(x)
