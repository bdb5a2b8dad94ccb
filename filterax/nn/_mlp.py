"""`MLP`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, ArrayLike, PRNGKeyArray

from .._mapping import filter_vmap
from .._module import Module, field
from .._sharding import sublayer_axes
from .._tree._filters import is_array
from ._linear import Linear
from ._shared_helpers import check_key, non_negative_int

__all__ = ["MLP"]


def _identity(x: Any) -> Any:
    return x


def _apply(activation: Callable[[Any], Any], x: Any) -> Any:
    return activation(x)


# Maps an activation over the neurons of a layer: a learnt activation holds one
# copy of its parameters per neuron (stacked on axis 0), a plain function none.
_per_neuron = filter_vmap(_apply)


# By default every layer keeps `Linear`'s own names, so that an MLP's layers
# are the very `Linear`s (same static part) that Equinox's MLP holds.
_MLP_AXES: dict[str, dict[str, tuple[str | None, ...]]] = {
    "first": {},
    "hidden": {},
    "last": {},
}


class MLP(Module):
    """A multi-layer perceptron: `depth` hidden layers of `width_size` neurons.

    The layers are [`Linear`][filterax.nn.Linear]s: `in_size -> width_size`,
    then `depth - 1` times `width_size -> width_size`, then `width_size ->
    out_size` (a single `in_size -> out_size` layer when `depth` is 0).
    `activation` follows every layer but the last, `final_activation` the
    last. Both may be learnt (e.g. a [`PReLU`][filterax.nn.PReLU]): each
    neuron then gets its own copy of their parameters, so `activation`'s
    arrays gain leading axes `(depth, width_size)` and `final_activation`'s a
    leading axis `(out_size,)` (none for a `"scalar"` output).

    The parameters are the same as `equinox.nn.MLP` draws from the same key.

    **Arguments:**

    - `in_size`: the input size, or `"scalar"` for an input of shape `()`.
    - `out_size`: the output size, or `"scalar"` for an output of shape `()`.
    - `width_size`: the size of each hidden layer.
    - `depth`: the number of hidden layers.
    - `activation`: the activation after each hidden layer (default
      `jax.nn.relu`), applied to one scalar neuron at a time.
    - `final_activation`: the activation after the output layer (default: the
      identity).
    - `use_bias`: whether the hidden layers have biases.
    - `use_final_bias`: whether the output layer has a bias.
    - `dtype`: the parameters' dtype. Defaults to `float32`, or `float64` when
      `jax_enable_x64` is on.
    - `scan`: store the `depth - 1` middle layers stacked in one `Linear` and
      run them with `jax.lax.scan` (keyword only): tracing and compiling then
      cost the same at every depth. `layers` is then `(first, middle, last)`.
    - `key`: a PRNG key for the initialisation (keyword only).
    - `axes`: logical axes of the layers' parameters replacing `Linear`'s
      defaults (`weight: ("out", "in")`, `bias: ("out",)`; keyword only), by
      role: `"first"`, `"hidden"` (every middle layer) and `"last"`, each an
      `axes=` mapping for [`Linear`][filterax.nn.Linear]. For tensor
      parallelism name the hidden dimension, e.g. `dict(first=dict(weight=("mlp",
      "embed"), bias=("mlp",)), last=dict(weight=("embed", "mlp")))`, and map `"mlp"` to a mesh axis: see
      [`sharding_of`][filterax.sharding_of]. With `depth=0` the one layer
      takes `"first"`'s names.

    **Returns:** the model.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> mlp = fx.nn.MLP(2, 3, width_size=8, depth=2, key=jax.random.key(0))
    >>> [layer.weight.shape for layer in mlp.layers]
    [(8, 2), (8, 8), (3, 8)]
    >>> mlp(jnp.ones(2)).shape
    (3,)
    >>> deep = fx.nn.MLP(2, 3, 8, depth=2, scan=True, key=jax.random.key(0))
    >>> bool(jnp.allclose(deep(jnp.ones(2)), mlp(jnp.ones(2))))
    True

    ```
    """

    layers: tuple[Linear, ...]
    activation: Callable[..., Any]
    final_activation: Callable[..., Any]
    use_bias: bool = field(static=True)
    use_final_bias: bool = field(static=True)
    in_size: int | Literal["scalar"] = field(static=True)
    out_size: int | Literal["scalar"] = field(static=True)
    width_size: int = field(static=True)
    depth: int = field(static=True)
    scan: bool = field(static=True, default=False)

    def __init__(
        self,
        in_size: int | Literal["scalar"],
        out_size: int | Literal["scalar"],
        width_size: int,
        depth: int,
        activation: Callable[..., Any] = jax.nn.relu,
        final_activation: Callable[..., Any] = _identity,
        use_bias: bool = True,
        use_final_bias: bool = True,
        dtype: Any = None,
        *,
        scan: bool = False,
        key: PRNGKeyArray,
        axes: dict[str, dict[str, tuple[str | None, ...]]] | None = None,
    ):
        depth = non_negative_int(depth, "MLP", "depth")
        check_key(key, "MLP")
        roles = sublayer_axes("MLP", axes, _MLP_AXES)
        keys = jax.random.split(key, depth + 1)

        def hidden(layer_key: Any) -> Linear:
            return Linear(
                width_size,
                width_size,
                use_bias,
                dtype,
                key=layer_key,
                axes=roles["hidden"],
            )

        if depth == 0:
            layers = [
                Linear(
                    in_size,
                    out_size,
                    use_final_bias,
                    dtype,
                    key=keys[0],
                    axes=roles["first"],
                )
            ]
        else:
            first = Linear(
                in_size, width_size, use_bias, dtype, key=keys[0], axes=roles["first"]
            )
            last = Linear(
                width_size,
                out_size,
                use_final_bias,
                dtype,
                key=keys[-1],
                axes=roles["last"],
            )
            if scan:
                middle = [filter_vmap(hidden)(keys[1:depth])]
            else:
                middle = [hidden(keys[i]) for i in range(1, depth)]
            layers = [first, *middle, last]
        self.layers = tuple(layers)
        self.activation = filter_vmap(
            filter_vmap(lambda: activation, axis_size=width_size), axis_size=depth
        )()
        if out_size == "scalar":
            self.final_activation = final_activation
        else:
            self.final_activation = filter_vmap(
                lambda: final_activation, axis_size=out_size
            )()
        self.use_bias = use_bias
        self.use_final_bias = use_final_bias
        self.in_size = in_size
        self.out_size = out_size
        self.width_size = width_size
        self.depth = depth
        self.scan = scan

    def _activation_of_layer(self, i: int | Array) -> Callable[..., Any]:
        return jtu.tree_map(
            lambda leaf: leaf[i] if is_array(leaf) else leaf, self.activation
        )

    def __call__(self, x: ArrayLike, *, key: PRNGKeyArray | None = None) -> Array:
        """Applies the network to one input.

        **Arguments:**

        - `x`: an array of shape `(in_size,)`, or `()` when `in_size="scalar"`.
        - `key`: ignored.

        **Returns:** an array of shape `(out_size,)`, or `()` when
        `out_size="scalar"`.

        ```python
        >>> import jax, jax.numpy as jnp
        >>> import filterax as fx
        >>> mlp = fx.nn.MLP("scalar", "scalar", 4, 1, key=jax.random.key(0))
        >>> mlp(1.0).shape
        ()

        ```
        """
        del key
        if self.depth == 0:
            [layer] = self.layers
            out = layer(x)
        elif self.scan:
            first, middle, last = self.layers
            hidden = _per_neuron(self._activation_of_layer(0), first(x))

            def step(
                h: Array, index_and_layer: tuple[Array, Linear]
            ) -> tuple[Array, None]:
                i, layer = index_and_layer
                return _per_neuron(self._activation_of_layer(i), layer(h)), None

            hidden, _ = jax.lax.scan(step, hidden, (jnp.arange(1, self.depth), middle))
            out = last(hidden)
        else:
            hidden = x
            for i, layer in enumerate(self.layers[:-1]):
                hidden = _per_neuron(self._activation_of_layer(i), layer(hidden))
            out = self.layers[-1](hidden)
        if self.out_size == "scalar":
            return self.final_activation(out)
        return _per_neuron(self.final_activation, out)
