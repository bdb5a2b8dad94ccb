"""`Linear` and `Identity`."""

from __future__ import annotations

import math
from typing import Any, Literal, TypeVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Inexact, PRNGKeyArray

from .._module import Module, field
from .._sharding import axes_overrides_field, declared_axes, layer_axes, matmul
from ._shared_helpers import check_key, non_negative_int, uniform_init

__all__ = ["Identity", "Linear"]

_T = TypeVar("_T")


def _check_features(value: Any, name: str) -> int | Literal["scalar"]:
    if isinstance(value, str):
        if value == "scalar":
            return "scalar"
        raise ValueError(f"Linear: `{name}` must be an int or 'scalar', got {value!r}.")
    try:
        return non_negative_int(value, "Linear", name)
    except TypeError:
        raise TypeError(
            f"Linear: `{name}` must be a non-negative int or 'scalar', got {value!r}."
        ) from None


class Linear(Module):
    """A dense layer: `weight @ x + bias`.

    The weight has shape `(out_features, in_features)` and the bias
    `(out_features,)`; both are drawn uniformly from `[-1/sqrt(in_features),
    1/sqrt(in_features))` (from `[-1, 1)` when `in_features` is 0), the same
    values as `equinox.nn.Linear` draws from the same key.

    **Arguments:**

    - `in_features`: the size of the input vector, or `"scalar"` for an input of
      shape `()`.
    - `out_features`: the size of the output vector, or `"scalar"` for an output
      of shape `()`.
    - `use_bias`: whether to add a bias; `bias` is `None` otherwise.
    - `dtype`: the dtype of the parameters (floating or complex). Defaults to
      `float32`, or `float64` when `jax_enable_x64` is on.
    - `key`: a PRNG key for the initialisation (keyword only).
    - `axes`: logical axes replacing the defaults for this layer, by field name
      (keyword only), e.g. `dict(weight=("mlp", "embed"), bias=("mlp",))`.
      The defaults are `weight: ("out", "in")` and `bias: ("out",)`; see
      [`sharding_of`][filterax.sharding_of].

    **Returns:** the layer. Call it on one vector; use
    [`filter_vmap`][filterax.filter_vmap] or `jax.vmap` for a batch.

    **Raises:** `ValueError` when `axes` names another field or gives the
    wrong number of names.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> linear = fx.nn.Linear(3, 4, key=jax.random.key(0))
    >>> linear.weight.shape, linear.bias.shape
    ((4, 3), (4,))
    >>> x = jnp.arange(3.0)
    >>> bool(jnp.allclose(linear(x), linear.weight @ x + linear.bias))
    True
    >>> fx.nn.Linear("scalar", 2, key=jax.random.key(0))(1.0).shape
    (2,)

    ```
    """

    weight: Inexact[Array, "out_features in_features"] = field(axes=("out", "in"))
    bias: Inexact[Array, " out_features"] | None = field(axes=("out",))
    in_features: int | Literal["scalar"] = field(static=True)
    out_features: int | Literal["scalar"] = field(static=True)
    use_bias: bool = field(static=True)
    axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = axes_overrides_field()

    def __init__(
        self,
        in_features: int | Literal["scalar"],
        out_features: int | Literal["scalar"],
        use_bias: bool = True,
        dtype: Any = None,
        *,
        key: PRNGKeyArray,
        axes: dict[str, tuple[str | None, ...]] | None = None,
    ):
        self.axes = layer_axes("Linear", axes, declared_axes(type(self)))
        in_features = _check_features(in_features, "in_features")
        out_features = _check_features(out_features, "out_features")
        check_key(key, "Linear")
        n_in = 1 if in_features == "scalar" else in_features
        n_out = 1 if out_features == "scalar" else out_features
        limit = 1.0 if n_in == 0 else 1 / math.sqrt(n_in)
        weight_key, bias_key = jax.random.split(key, 2)
        self.weight = uniform_init(weight_key, (n_out, n_in), dtype, limit)
        self.bias = uniform_init(bias_key, (n_out,), dtype, limit) if use_bias else None
        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = use_bias

    def __call__(self, x: ArrayLike, *, key: PRNGKeyArray | None = None) -> Array:
        """Applies the layer to one input.

        **Arguments:**

        - `x`: an array of shape `(in_features,)`, or of shape `()` when
          `in_features="scalar"`.
        - `key`: ignored; accepted so that every layer can be called alike.

        **Returns:** an array of shape `(out_features,)`, or `()` when
        `out_features="scalar"`.

        **Raises:** `ValueError` when `x` has another shape.

        ```python
        >>> import jax, jax.numpy as jnp
        >>> import filterax as fx
        >>> fx.nn.Linear(2, "scalar", key=jax.random.key(1))(jnp.ones(2)).shape
        ()

        ```
        """
        del key
        shape = jnp.shape(x)
        if self.in_features == "scalar":
            if shape != ():
                raise ValueError(
                    "Linear(in_features='scalar') expects an input of shape (), got "
                    f"shape {shape}."
                )
            x = jnp.reshape(x, (1,))
        elif shape != (self.in_features,):
            raise ValueError(
                f"Linear expects an input of shape ({self.in_features},), got shape "
                f"{shape}. For a batch of inputs, map the layer with "
                "`filterax.filter_vmap` or `jax.vmap`."
            )
        # `weight @ x`, in this order, as Equinox computes it: under an eager
        # `jax.vmap` this is a dot_general producing (out, batch) followed by a
        # transpose, and a product written the other way round (`x @ weight.T`,
        # batch leading) runs a different CPU kernel whose sums differ by an ulp.
        dtype = jnp.result_type(x, self.weight)
        # On `Explicit` mesh axes, a split contracted dimension (a row-parallel
        # layer) is summed as JAX asks: see `matmul`.
        out = matmul(self.weight.astype(dtype), jnp.asarray(x, dtype))
        if self.bias is not None:
            out = out + self.bias
        if self.out_features == "scalar":
            out = jnp.reshape(out, ())
        return out


class Identity(Module):
    """A layer that returns its input unchanged: a placeholder for another layer.

    **Arguments:** any positional and keyword arguments, all ignored (so that
    it can stand in for a layer whose constructor takes some).

    **Returns:** the layer, which has no fields: every `Identity` equals every
    other.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> fx.nn.Identity(3, name="unused")(jnp.arange(3)).tolist()
    [0, 1, 2]
    >>> fx.nn.Identity() == fx.nn.Identity(5)
    True

    ```
    """

    def __init__(self, *args: Any, **kwargs: Any):
        del args, kwargs

    def __call__(self, x: _T, *, key: PRNGKeyArray | None = None) -> _T:
        """Returns `x`.

        **Arguments:**

        - `x`: anything.
        - `key`: ignored.

        **Returns:** `x` itself.

        ```python
        >>> import filterax as fx
        >>> fx.nn.Identity()("anything")
        'anything'

        ```
        """
        del key
        return x
