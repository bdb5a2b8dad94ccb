"""Pooling over sliding windows (`Pool`, `AvgPool*`, `MaxPool*`) and adaptive
pooling to a target shape (`AdaptivePool`, `AdaptiveAvgPool*`, `AdaptiveMaxPool*`).

Field order and call semantics follow `equinox.nn`.
"""

import math
from collections.abc import Callable, Sequence
from typing import ClassVar

import jax
import jax.lax as lax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from .._module import Module, field
from ._shared_helpers import (
    PaddingPairsLike,
    check_input,
    parse_ints,
    parse_padding_pairs,
)

__all__ = [
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
    "AdaptivePool",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "Pool",
]


class PoolPaddingError(ValueError, RuntimeError):
    """Pooling padding wider than the kernel. A `ValueError`, as filterax
    documents, and a `RuntimeError`, as Equinox raises there."""


def _check_padding_fits_kernel(
    padding: tuple[tuple[int, int], ...], kernel_size: tuple[int, ...]
) -> None:
    for pair, k in zip(padding, kernel_size):
        if max(pair) > k:
            raise PoolPaddingError(
                f"Pooling padding may not exceed the kernel size: padding {pair} "
                f"(including any added by `use_ceil`) for kernel size {k}."
            )


class Pool(Module):
    """Reduces each sliding window of the input with a binary operation.

    The windows slide over the spatial dimensions of an input of shape
    `(channels, *spatial)`, each channel separately; each output element is
    `init` combined, by `operation`, with every element of its window (padding
    elements hold `init`). For the result to be differentiable `init` must be
    an identity of `operation` (`operation(init, v) == v`), as `0` is for
    `lax.add` and `-inf` for `lax.max`.

    **Arguments:**

    - `init`: the starting value of each reduction.
    - `operation`: a binary, associative reduction such as `lax.add` or `lax.max`.
    - `num_spatial_dims`: how many spatial dimensions the input has.
    - `kernel_size`: the window size, an int or one int per dimension.
    - `stride`: the step between windows, an int or one per dimension
      (default `1`).
    - `padding`: an int, one int per dimension, or one `(before, after)` pair per
      dimension; no entry may exceed the kernel size.
    - `use_ceil`: if `True`, the output size rounds up rather than down, padding
      the end of a dimension by one more stride where windows do not fit exactly.

    **Returns:** the layer. Calling it on `x` of shape `(channels, *spatial)`
    returns an array of shape `(channels, *new_spatial)`.

    **Raises:** `ValueError` for a malformed argument, padding larger than the
    kernel, or (when called) an input of the wrong rank.

    ```python
    >>> import jax.lax as lax, jax.numpy as jnp
    >>> import filterax as fx
    >>> pool = fx.nn.Pool(-jnp.inf, lax.max, 1, kernel_size=2, stride=2)
    >>> pool(jnp.array([[1.0, 5.0, 2.0, 0.0, 3.0]]))
    Array([[5., 2.]], dtype=float32)

    ```
    """

    init: int | float | Array
    operation: Callable[[Array, Array], Array]
    num_spatial_dims: int = field(static=True)
    kernel_size: tuple[int, ...] = field(static=True)
    stride: tuple[int, ...] = field(static=True)
    padding: tuple[tuple[int, int], ...] = field(static=True)
    use_ceil: bool = field(static=True)

    def __init__(
        self,
        init: int | float | Array,
        operation: Callable[[Array, Array], Array],
        num_spatial_dims: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: PaddingPairsLike = 0,
        use_ceil: bool = False,
    ):
        n = num_spatial_dims
        pairs = parse_padding_pairs(padding, n)
        self.init = init
        self.operation = operation
        self.num_spatial_dims = n
        self.kernel_size = parse_ints(kernel_size, n, "kernel_size", 1)
        self.stride = parse_ints(stride, n, "stride", 1)
        self.padding = pairs
        self.use_ceil = use_ceil
        _check_padding_fits_kernel(self.padding, self.kernel_size)

    def _ceil_padding(
        self, spatial_shape: tuple[int, ...]
    ) -> tuple[tuple[int, int], ...]:
        pairs = []
        for size, (before, after), k, s in zip(
            spatial_shape, self.padding, self.kernel_size, self.stride
        ):
            leftover = (size + before + after - k) % s
            pairs.append((before, after) if leftover == 0 else (before, after + s))
        return tuple(pairs)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Pools `x`.

        **Arguments:**

        - `x`: an array of shape `(channels, *spatial)`.
        - `key`: ignored; accepted so that all layers can be called alike.

        **Returns:** an array of shape `(channels, *new_spatial)`.

        ```python
        >>> import jax.lax as lax, jax.numpy as jnp
        >>> import filterax as fx
        >>> pool = fx.nn.Pool(0, lax.add, 2, kernel_size=2)
        >>> pool(jnp.ones((1, 3, 3)))
        Array([[[4., 4.],
                [4., 4.]]], dtype=float32)

        ```
        """
        del key
        check_input(self, x, self.num_spatial_dims)
        padding = self.padding
        if self.use_ceil:
            padding = self._ceil_padding(tuple(x.shape[1:]))
            _check_padding_fits_kernel(padding, self.kernel_size)
        with jax.named_scope(f"filterax.nn.{type(self).__name__}"):
            # Channels last, with a unit batch axis, as Equinox lays it out:
            # XLA rounds the gradients of other layouts differently, and ported
            # training runs should match to the last bit.
            out = lax.reduce_window(
                jnp.moveaxis(x, 0, -1)[None],
                self.init,  # pyright: ignore[reportArgumentType]
                self.operation,
                (1, *self.kernel_size, 1),
                (1, *self.stride, 1),
                ((0, 0), *padding, (0, 0)),
            )
            return jnp.moveaxis(out[0], -1, 0)


class _AvgPoolNd(Pool):
    """The mean over each window, padding counted; the subclass fixes the rank."""

    _num_spatial_dims: ClassVar[int]

    def __init__(
        self,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: PaddingPairsLike = 0,
        use_ceil: bool = False,
    ):
        super().__init__(
            0, lax.add, self._num_spatial_dims, kernel_size, stride, padding, use_ceil
        )

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Averages each window of `x`.

        **Arguments:**

        - `x`: an array of shape `(channels, *spatial)`.
        - `key`: ignored; accepted so that all layers can be called alike.

        **Returns:** an array of shape `(channels, *new_spatial)`.

        ```python
        >>> import jax.numpy as jnp
        >>> import filterax as fx
        >>> fx.nn.AvgPool1d(2, stride=2)(jnp.array([[1.0, 3.0, 5.0, 9.0]]))
        Array([[2., 7.]], dtype=float32)

        ```
        """
        return super().__call__(x) / math.prod(self.kernel_size)


class _MaxPoolNd(Pool):
    """The maximum over each window; the subclass fixes the rank."""

    _num_spatial_dims: ClassVar[int]

    def __init__(
        self,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: PaddingPairsLike = 0,
        use_ceil: bool = False,
    ):
        super().__init__(
            -jnp.inf,
            lax.max,
            self._num_spatial_dims,
            kernel_size,
            stride,
            padding,
            use_ceil,
        )


class AvgPool1d(_AvgPoolNd):
    """One-dimensional average pooling: the mean over each sliding window, with
    padded elements counted as zeros.

    **Arguments:**

    - `kernel_size`: the window size, an int or one int per dimension.
    - `stride`: the step between windows, an int or one per dimension
      (default `1`, not `kernel_size`).
    - `padding`: an int, one int per dimension, or one `(before, after)` pair per
      dimension; no entry may exceed the kernel size.
    - `use_ceil`: if `True`, the output size rounds up rather than down.

    **Returns:** the layer, mapping `(channels, length)` to
    `(channels, new_length)`.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> fx.nn.AvgPool1d(kernel_size=2, stride=2)(jnp.array([[1.0, 3.0, 5.0, 9.0]]))
    Array([[2., 7.]], dtype=float32)

    ```
    """

    __init__ = _AvgPoolNd.__init__  # restated: type checkers see its signature

    _num_spatial_dims = 1


class AvgPool2d(_AvgPoolNd):
    """Two-dimensional average pooling: the mean over each sliding window, with
    padded elements counted as zeros.

    **Arguments:**

    - `kernel_size`: the window size, an int or one int per dimension.
    - `stride`: the step between windows, an int or one per dimension
      (default `1`, not `kernel_size`).
    - `padding`: an int, one int per dimension, or one `(before, after)` pair per
      dimension; no entry may exceed the kernel size.
    - `use_ceil`: if `True`, the output size rounds up rather than down.

    **Returns:** the layer, mapping `(channels, height, width)` to
    `(channels, new_height, new_width)`.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> fx.nn.AvgPool2d(kernel_size=2, stride=2)(jnp.ones((3, 8, 8))).shape
    (3, 4, 4)

    ```
    """

    __init__ = _AvgPoolNd.__init__  # restated: type checkers see its signature

    _num_spatial_dims = 2


class AvgPool3d(_AvgPoolNd):
    """Three-dimensional average pooling: the mean over each sliding window, with
    padded elements counted as zeros.

    **Arguments:**

    - `kernel_size`: the window size, an int or one int per dimension.
    - `stride`: the step between windows, an int or one per dimension
      (default `1`, not `kernel_size`).
    - `padding`: an int, one int per dimension, or one `(before, after)` pair per
      dimension; no entry may exceed the kernel size.
    - `use_ceil`: if `True`, the output size rounds up rather than down.

    **Returns:** the layer, mapping `(channels, depth, height, width)` to
    `(channels, new_depth, new_height, new_width)`.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> fx.nn.AvgPool3d(kernel_size=2, stride=2)(jnp.ones((1, 4, 4, 6))).shape
    (1, 2, 2, 3)

    ```
    """

    __init__ = _AvgPoolNd.__init__  # restated: type checkers see its signature

    _num_spatial_dims = 3


class MaxPool1d(_MaxPoolNd):
    """One-dimensional max pooling: the maximum over each sliding window (padding
    never wins).

    **Arguments:**

    - `kernel_size`: the window size, an int or one int per dimension.
    - `stride`: the step between windows, an int or one per dimension
      (default `1`, not `kernel_size`).
    - `padding`: an int, one int per dimension, or one `(before, after)` pair per
      dimension; no entry may exceed the kernel size.
    - `use_ceil`: if `True`, the output size rounds up rather than down.

    **Returns:** the layer, mapping `(channels, length)` to
    `(channels, new_length)`.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> fx.nn.MaxPool1d(kernel_size=2, stride=2)(jnp.array([[1.0, 3.0, 9.0, 5.0]]))
    Array([[3., 9.]], dtype=float32)

    ```
    """

    __init__ = _MaxPoolNd.__init__  # restated: type checkers see its signature

    _num_spatial_dims = 1


class MaxPool2d(_MaxPoolNd):
    """Two-dimensional max pooling: the maximum over each sliding window (padding
    never wins).

    **Arguments:**

    - `kernel_size`: the window size, an int or one int per dimension.
    - `stride`: the step between windows, an int or one per dimension
      (default `1`, not `kernel_size`).
    - `padding`: an int, one int per dimension, or one `(before, after)` pair per
      dimension; no entry may exceed the kernel size.
    - `use_ceil`: if `True`, the output size rounds up rather than down.

    **Returns:** the layer, mapping `(channels, height, width)` to
    `(channels, new_height, new_width)`.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> fx.nn.MaxPool2d(kernel_size=3, stride=2, padding=1)(jnp.ones((3, 8, 8))).shape
    (3, 4, 4)

    ```
    """

    __init__ = _MaxPoolNd.__init__  # restated: type checkers see its signature

    _num_spatial_dims = 2


class MaxPool3d(_MaxPoolNd):
    """Three-dimensional max pooling: the maximum over each sliding window
    (padding never wins).

    **Arguments:**

    - `kernel_size`: the window size, an int or one int per dimension.
    - `stride`: the step between windows, an int or one per dimension
      (default `1`, not `kernel_size`).
    - `padding`: an int, one int per dimension, or one `(before, after)` pair per
      dimension; no entry may exceed the kernel size.
    - `use_ceil`: if `True`, the output size rounds up rather than down.

    **Returns:** the layer, mapping `(channels, depth, height, width)` to
    `(channels, new_depth, new_height, new_width)`.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> pool = fx.nn.MaxPool3d(kernel_size=2, stride=2, use_ceil=True)
    >>> pool(jnp.ones((1, 5, 4, 4))).shape
    (1, 3, 2, 2)

    ```
    """

    __init__ = _MaxPoolNd.__init__  # restated: type checkers see its signature

    _num_spatial_dims = 3


def _adaptive_reduce_axis(
    x: Array, axis: int, target: int, operation: Callable[[Array], Array]
) -> Array:
    """Splits `x` along `axis` into `target` contiguous windows and reduces each.

    With `size = q * target + r`, the first `r` windows hold `q + 1` elements and
    the rest `q`. The one-dimensional pooling is mapped over every other axis,
    channels first, as Equinox composes it: XLA rounds other arrangements of
    the same reduction differently, and ported models should agree to the
    last bit.
    """
    pool = jax.vmap(_adaptive_reduce_1d, in_axes=(0, None, None))
    for other in range(1, x.ndim):
        if other != axis:
            pool = jax.vmap(pool, in_axes=(other, None, None), out_axes=other)
    return pool(x, target, operation)


def _adaptive_reduce_1d(
    x: Array, target: int, operation: Callable[[Array], Array]
) -> Array:
    base, extra = divmod(x.shape[0], target)
    if extra == 0:
        return jax.vmap(operation)(x.reshape(target, base))
    split = extra * (base + 1)
    longer = jax.vmap(operation)(x[:split].reshape(extra, base + 1))
    shorter = jax.vmap(operation)(x[split:].reshape(target - extra, base))
    return jnp.concatenate([longer, shorter])


class AdaptivePool(Module):
    """Reduces the input to a fixed spatial shape, whatever its input shape.

    Each spatial dimension of size `size` is cut into `target` contiguous
    windows, in turn from the first dimension to the last: with
    `size = q * target + r`, the first `r` windows hold `q + 1` elements and the
    others `q`. `operation` reduces each window. (These windows are those of
    Equinox, which differ from PyTorch's overlapping ones when `target` does not
    divide `size`.)

    **Arguments:**

    - `target_shape`: the output's spatial shape, an int or one int per dimension.
    - `num_spatial_dims`: how many spatial dimensions the input has.
    - `operation`: maps a one-dimensional array to a scalar, such as `jnp.mean`.

    **Returns:** the layer. Calling it on `x` of shape `(channels, *spatial)`
    returns an array of shape `(channels, *target_shape)`.

    **Raises:** `ValueError` for a malformed `target_shape`, or (when called) an
    input of the wrong rank or with a spatial dimension smaller than its target.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> pool = fx.nn.AdaptivePool(2, num_spatial_dims=1, operation=jnp.sum)
    >>> pool(jnp.array([[1.0, 2.0, 3.0, 4.0, 5.0]]))
    Array([[6., 9.]], dtype=float32)

    ```
    """

    target_shape: tuple[int, ...] = field(static=True)
    operation: Callable[[Array], Array]

    def __init__(
        self,
        target_shape: int | Sequence[int],
        num_spatial_dims: int,
        operation: Callable[[Array], Array],
    ):
        self.target_shape = parse_ints(
            target_shape, num_spatial_dims, "target_shape", 1
        )
        self.operation = operation

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Pools `x` to the target shape.

        **Arguments:**

        - `x`: an array of shape `(channels, *spatial)`, each spatial dimension at
          least as large as its target.
        - `key`: ignored; accepted so that all layers can be called alike.

        **Returns:** an array of shape `(channels, *target_shape)`.

        ```python
        >>> import jax.numpy as jnp
        >>> import filterax as fx
        >>> fx.nn.AdaptiveMaxPool2d((1, 2))(jnp.arange(8.0).reshape(1, 2, 4))
        Array([[[5., 7.]]], dtype=float32)

        ```
        """
        del key
        check_input(self, x, len(self.target_shape))
        for dim, (size, target) in enumerate(zip(x.shape[1:], self.target_shape)):
            if size < target:
                raise ValueError(
                    f"{type(self).__name__} cannot pool spatial dimension {dim} of "
                    f"size {size} to size {target}: each spatial dimension of the "
                    f"input must be at least its target {self.target_shape}; got "
                    f"input shape {tuple(x.shape)}."
                )
        with jax.named_scope(f"filterax.nn.{type(self).__name__}"):
            for axis, target in enumerate(self.target_shape, start=1):
                x = _adaptive_reduce_axis(x, axis, target, self.operation)
            return x


class _AdaptiveAvgPoolNd(AdaptivePool):
    """`AdaptivePool` with `jnp.mean`; the subclass fixes the rank."""

    _num_spatial_dims: ClassVar[int]

    def __init__(self, target_shape: int | Sequence[int]):
        super().__init__(target_shape, self._num_spatial_dims, jnp.mean)


class _AdaptiveMaxPoolNd(AdaptivePool):
    """`AdaptivePool` with `jnp.max`; the subclass fixes the rank."""

    _num_spatial_dims: ClassVar[int]

    def __init__(self, target_shape: int | Sequence[int]):
        super().__init__(target_shape, self._num_spatial_dims, jnp.max)


class AdaptiveAvgPool1d(_AdaptiveAvgPoolNd):
    """One-dimensional adaptive average pooling to a fixed length.

    **Arguments:**

    - `target_shape`: the output length, an int or a 1-sequence.

    **Returns:** the layer, mapping `(channels, length)` to
    `(channels, target_shape)`.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> fx.nn.AdaptiveAvgPool1d(2)(jnp.array([[1.0, 2.0, 3.0, 4.0, 5.0]]))
    Array([[2. , 4.5]], dtype=float32)

    ```
    """

    __init__ = _AdaptiveAvgPoolNd.__init__  # restated: type checkers see its signature

    _num_spatial_dims = 1


class AdaptiveAvgPool2d(_AdaptiveAvgPoolNd):
    """Two-dimensional adaptive average pooling to a fixed spatial shape.

    **Arguments:**

    - `target_shape`: the output's `(height, width)`, or one int for both.

    **Returns:** the layer, mapping `(channels, height, width)` to
    `(channels, *target_shape)`.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> fx.nn.AdaptiveAvgPool2d(1)(jnp.ones((8, 7, 5))).shape
    (8, 1, 1)

    ```
    """

    __init__ = _AdaptiveAvgPoolNd.__init__  # restated: type checkers see its signature

    _num_spatial_dims = 2


class AdaptiveAvgPool3d(_AdaptiveAvgPoolNd):
    """Three-dimensional adaptive average pooling to a fixed spatial shape.

    **Arguments:**

    - `target_shape`: the output's `(depth, height, width)`, or one int for all.

    **Returns:** the layer, mapping `(channels, depth, height, width)` to
    `(channels, *target_shape)`.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> fx.nn.AdaptiveAvgPool3d((2, 1, 3))(jnp.ones((4, 5, 5, 5))).shape
    (4, 2, 1, 3)

    ```
    """

    __init__ = _AdaptiveAvgPoolNd.__init__  # restated: type checkers see its signature

    _num_spatial_dims = 3


class AdaptiveMaxPool1d(_AdaptiveMaxPoolNd):
    """One-dimensional adaptive max pooling to a fixed length.

    **Arguments:**

    - `target_shape`: the output length, an int or a 1-sequence.

    **Returns:** the layer, mapping `(channels, length)` to
    `(channels, target_shape)`.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> fx.nn.AdaptiveMaxPool1d(2)(jnp.array([[1.0, 7.0, 3.0, 4.0, 5.0]]))
    Array([[7., 5.]], dtype=float32)

    ```
    """

    __init__ = _AdaptiveMaxPoolNd.__init__  # restated: type checkers see its signature

    _num_spatial_dims = 1


class AdaptiveMaxPool2d(_AdaptiveMaxPoolNd):
    """Two-dimensional adaptive max pooling to a fixed spatial shape.

    **Arguments:**

    - `target_shape`: the output's `(height, width)`, or one int for both.

    **Returns:** the layer, mapping `(channels, height, width)` to
    `(channels, *target_shape)`.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> fx.nn.AdaptiveMaxPool2d((2, 2))(jnp.arange(16.0).reshape(1, 4, 4))
    Array([[[ 5.,  7.],
            [13., 15.]]], dtype=float32)

    ```
    """

    __init__ = _AdaptiveMaxPoolNd.__init__  # restated: type checkers see its signature

    _num_spatial_dims = 2


class AdaptiveMaxPool3d(_AdaptiveMaxPoolNd):
    """Three-dimensional adaptive max pooling to a fixed spatial shape.

    **Arguments:**

    - `target_shape`: the output's `(depth, height, width)`, or one int for all.

    **Returns:** the layer, mapping `(channels, depth, height, width)` to
    `(channels, *target_shape)`.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> fx.nn.AdaptiveMaxPool3d(1)(jnp.ones((2, 3, 4, 5))).shape
    (2, 1, 1, 1)

    ```
    """

    __init__ = _AdaptiveMaxPoolNd.__init__  # restated: type checkers see its signature

    _num_spatial_dims = 3
