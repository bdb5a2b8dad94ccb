"""Convolutions (`Conv`) and transposed convolutions (`ConvTranspose`), in any
number of spatial dimensions, plus their 1/2/3-dimensional shorthands.

Parameter shapes, initialisation, field order and call semantics follow
`equinox.nn`, so that Equinox checkpoints load leaf by leaf. The argument
parsers shared with the pools live in `_shared_helpers.py`.
"""

import math
from collections.abc import Sequence
from typing import ClassVar

import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.random as jr
from jax.typing import DTypeLike
from jaxtyping import Array, Inexact, PRNGKeyArray

from .._ad import unfrozen
from .._module import Module, field
from .._sharding import axes_overrides_field, layer_axes
from ._shared_helpers import (
    PaddingPairsLike,
    check_input,
    is_int,
    parse_ints,
    parse_padding_pairs,
    uniform_init,
)

__all__ = [
    "Conv",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
]

PaddingLike = str | PaddingPairsLike
Padding = str | tuple[tuple[int, int], ...]

_PADDING_STRINGS = ("SAME", "SAME_LOWER", "VALID")
_PADDING_MODES = ("ZEROS", "REFLECT", "REPLICATE", "CIRCULAR")
# `jnp.pad` names for the padding modes other than zeros.
_JNP_PAD_MODES = {"REFLECT": "reflect", "REPLICATE": "edge", "CIRCULAR": "wrap"}


def _parse_padding(padding: PaddingLike, num_spatial_dims: int) -> Padding:
    if isinstance(padding, str):
        if padding.upper() not in _PADDING_STRINGS:
            raise ValueError(
                "`padding` as a string must be 'SAME', 'SAME_LOWER' or 'VALID' "
                f"(any case), got {padding!r}."
            )
        return padding.upper()
    return parse_padding_pairs(padding, num_spatial_dims, strings=True)


def _parse_padding_mode(padding_mode: str) -> str:
    if not isinstance(padding_mode, str) or padding_mode.upper() not in _PADDING_MODES:
        raise ValueError(
            "`padding_mode` must be 'ZEROS', 'REFLECT', 'REPLICATE' or 'CIRCULAR' "
            f"(any case), got {padding_mode!r}."
        )
    return padding_mode.upper()


def _check_groups(in_channels: int, out_channels: int, groups: int) -> None:
    if not is_int(groups) or groups < 1:
        raise ValueError(f"`groups` must be a positive int, got {groups!r}.")
    for name, channels in (
        ("in_channels", in_channels),
        ("out_channels", out_channels),
    ):
        if channels % groups != 0:
            raise ValueError(
                f"`{name}` (={channels}) must be divisible by `groups` (={groups})."
            )


def _init_weight_and_bias(
    key: PRNGKeyArray,
    in_channels: int,
    out_channels: int,
    kernel_size: tuple[int, ...],
    groups: int,
    use_bias: bool,
    dtype: DTypeLike | None,
) -> tuple[Array, Array | None]:
    weight_key, bias_key = jr.split(key, 2)
    fan_in = (in_channels // groups) * math.prod(kernel_size)
    limit = 1 / math.sqrt(fan_in)
    weight_shape = (out_channels, in_channels // groups, *kernel_size)
    weight = uniform_init(weight_key, weight_shape, dtype, limit)
    if not use_bias:
        return weight, None
    bias_shape = (out_channels,) + (1,) * len(kernel_size)
    return weight, uniform_init(bias_key, bias_shape, dtype, limit)


def _convolve(
    layer: "Conv | ConvTranspose",
    x: Array,
    window_strides: Sequence[int],
    padding: str | Sequence[tuple[int, int]],
    lhs_dilation: Sequence[int] | None = None,
) -> Array:
    """`x` (no batch axis) convolved with `layer`'s weight, plus its bias."""
    out = lax.conv_general_dilated(
        lhs=x[None],
        rhs=unfrozen(layer.weight),
        window_strides=window_strides,
        padding=padding,
        lhs_dilation=lhs_dilation,
        rhs_dilation=layer.dilation,
        feature_group_count=layer.groups,
    )[0]
    if layer.bias is not None:
        out = out + layer.bias
    return out


def _conv_axes(
    layer: str, axes: dict[str, tuple[str | None, ...]] | None, spatial: int
) -> tuple[tuple[str, tuple[str | None, ...]], ...] | None:
    # The ranks depend on `num_spatial_dims`, so the names live on the instance.
    defaults = {
        "weight": ("out", "in", *((None,) * spatial)),
        "bias": ("out", *((None,) * spatial)),
    }
    return layer_axes(layer, axes, defaults, keep_defaults=True)


class Conv(Module):
    """A convolution over `num_spatial_dims` spatial dimensions.

    Maps `(in_channels, *spatial)` to `(out_channels, *new_spatial)`, with no
    batch axis (use `jax.vmap` to batch). The weight has shape
    `(out_channels, in_channels // groups, *kernel_size)` and the bias
    `(out_channels, 1, ..., 1)`; both start uniform on `±1/sqrt(fan_in)`, with
    `fan_in = in_channels // groups * prod(kernel_size)`.

    **Arguments:**

    - `num_spatial_dims`: how many spatial dimensions the input has.
    - `in_channels`, `out_channels`: channel counts of the input and output.
    - `kernel_size`: the size of the kernel, an int or one int per dimension.
    - `stride`: the step between kernel positions (int or one per dimension).
    - `padding`: `'VALID'` (no padding), `'SAME'` / `'SAME_LOWER'` (enough padding
      that the output size is `ceil(size / stride)`; an odd total puts the extra
      element after, respectively before), an int, one int per dimension, or one
      `(before, after)` pair per dimension. Strings are case-insensitive.
    - `dilation`: the spacing between kernel elements (int or one per dimension).
    - `groups`: split the channels into this many independent groups; both
      `in_channels` and `out_channels` must be divisible by it.
    - `use_bias`: whether to add a bias.
    - `padding_mode`: what the padding holds: `'ZEROS'` (`1234 -> 00123400`),
      `'REFLECT'` (`32123432`), `'REPLICATE'` (`11123444`) or `'CIRCULAR'`
      (`34123412`).
    - `dtype`: dtype of the parameters, floating or complex; defaults to
      `float32` (`float64` when JAX's x64 mode is on).
    - `key`: a PRNG key for the initialisation (keyword only).
    - `axes`: logical axes replacing the defaults for this layer, by field name
      (keyword only). The defaults are `weight: ("out", "in", None, ...)` and
      `bias: ("out", None, ...)`: the kernel's spatial dimensions are small and
      never split. See [`sharding_of`][filterax.sharding_of].

    **Returns:** the layer. Calling it on `x` of shape `(in_channels, *spatial)`
    returns an array of shape `(out_channels, *new_spatial)`.

    **Raises:** `ValueError` for a malformed argument, channel counts not divisible
    by `groups`, or (when called) an input of the wrong rank or channel count.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> conv = fx.nn.Conv(2, 3, 8, kernel_size=3, padding="SAME", key=jax.random.key(0))
    >>> conv.weight.shape, conv.bias.shape
    ((8, 3, 3, 3), (8, 1, 1))
    >>> conv(jnp.ones((3, 16, 16))).shape
    (8, 16, 16)

    ```
    """

    num_spatial_dims: int = field(static=True)
    weight: Inexact[Array, "out_channels in_channels_per_group *kernel_size"]
    bias: Inexact[Array, "out_channels ..."] | None
    in_channels: int = field(static=True)
    out_channels: int = field(static=True)
    kernel_size: tuple[int, ...] = field(static=True)
    stride: tuple[int, ...] = field(static=True)
    padding: Padding = field(static=True)
    dilation: tuple[int, ...] = field(static=True)
    groups: int = field(static=True)
    use_bias: bool = field(static=True)
    padding_mode: str = field(static=True)
    axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = axes_overrides_field()

    def __init__(
        self,
        num_spatial_dims: int,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: PaddingLike = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        use_bias: bool = True,
        padding_mode: str = "ZEROS",
        dtype: DTypeLike | None = None,
        *,
        key: PRNGKeyArray,
        axes: dict[str, tuple[str | None, ...]] | None = None,
    ):
        kernel_size = parse_ints(kernel_size, num_spatial_dims, "kernel_size", 1)
        _check_groups(in_channels, out_channels, groups)
        self.weight, self.bias = _init_weight_and_bias(
            key, in_channels, out_channels, kernel_size, groups, use_bias, dtype
        )
        self.axes = _conv_axes(type(self).__name__, axes, len(kernel_size))
        self.num_spatial_dims = num_spatial_dims
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = kernel_size
        self.stride = parse_ints(stride, num_spatial_dims, "stride", 1)
        self.padding = _parse_padding(padding, num_spatial_dims)
        self.dilation = parse_ints(dilation, num_spatial_dims, "dilation", 1)
        self.groups = groups
        self.use_bias = use_bias
        self.padding_mode = _parse_padding_mode(padding_mode)

    def _padding_pairs(self, spatial_shape: tuple[int, ...]) -> list[tuple[int, int]]:
        if not isinstance(self.padding, str):
            return list(self.padding)
        dilated_kernel = tuple(
            d * (k - 1) + 1 for k, d in zip(self.kernel_size, self.dilation)
        )
        return lax.padtype_to_pads(
            spatial_shape, dilated_kernel, self.stride, self.padding
        )

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Convolves `x`.

        **Arguments:**

        - `x`: an array of shape `(in_channels, *spatial)`.
        - `key`: ignored; accepted so that all layers can be called alike.

        **Returns:** an array of shape `(out_channels, *new_spatial)`.

        ```python
        >>> import jax, jax.numpy as jnp
        >>> import filterax as fx
        >>> conv = fx.nn.Conv(1, 2, 4, kernel_size=3, stride=2, key=jax.random.key(0))
        >>> conv(jnp.ones((2, 9))).shape
        (4, 4)

        ```
        """
        del key
        check_input(self, x, self.num_spatial_dims, self.in_channels)
        with jax.named_scope(f"filterax.nn.{type(self).__name__}"):
            padding = self.padding
            if self.padding_mode != "ZEROS":
                pairs = self._padding_pairs(tuple(x.shape[1:]))
                mode = _JNP_PAD_MODES[self.padding_mode]
                x = jnp.pad(x, [(0, 0), *pairs], mode=mode)  # pyright: ignore[reportArgumentType]
                padding = "VALID"
            return _convolve(self, x, self.stride, padding)


class _ConvNd(Conv):
    """`Conv` with `num_spatial_dims` fixed by the subclass."""

    _num_spatial_dims: ClassVar[int]

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: PaddingLike = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        use_bias: bool = True,
        padding_mode: str = "ZEROS",
        dtype: DTypeLike | None = None,
        *,
        key: PRNGKeyArray,
        axes: dict[str, tuple[str | None, ...]] | None = None,
    ):
        super().__init__(
            self._num_spatial_dims,
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            dilation,
            groups,
            use_bias,
            padding_mode,
            dtype,
            key=key,
            axes=axes,
        )


class Conv1d(_ConvNd):
    """A one-dimensional convolution: [`Conv`][filterax.nn.Conv] with
    `num_spatial_dims=1`.

    **Arguments:** as for `Conv`, without `num_spatial_dims`: `in_channels`,
    `out_channels`, `kernel_size`, `stride=1`, `padding=0`, `dilation=1`,
    `groups=1`, `use_bias=True`, `padding_mode="ZEROS"`, `dtype=None`, `key`, `axes`.

    **Returns:** the layer, mapping `(in_channels, length)` to
    `(out_channels, new_length)`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> conv = fx.nn.Conv1d(2, 4, kernel_size=3, key=jax.random.key(0))
    >>> conv(jnp.ones((2, 10))).shape
    (4, 8)

    ```
    """

    __init__ = _ConvNd.__init__  # restated: type checkers see its signature

    _num_spatial_dims = 1


class Conv2d(_ConvNd):
    """A two-dimensional convolution: [`Conv`][filterax.nn.Conv] with
    `num_spatial_dims=2`.

    **Arguments:** as for `Conv`, without `num_spatial_dims`: `in_channels`,
    `out_channels`, `kernel_size`, `stride=1`, `padding=0`, `dilation=1`,
    `groups=1`, `use_bias=True`, `padding_mode="ZEROS"`, `dtype=None`, `key`, `axes`.

    **Returns:** the layer, mapping `(in_channels, height, width)` to
    `(out_channels, new_height, new_width)`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> conv = fx.nn.Conv2d(3, 4, kernel_size=3, stride=2, padding=1, key=jax.random.key(0))
    >>> conv(jnp.ones((3, 32, 32))).shape
    (4, 16, 16)

    ```
    """

    __init__ = _ConvNd.__init__  # restated: type checkers see its signature

    _num_spatial_dims = 2


class Conv3d(_ConvNd):
    """A three-dimensional convolution: [`Conv`][filterax.nn.Conv] with
    `num_spatial_dims=3`.

    **Arguments:** as for `Conv`, without `num_spatial_dims`: `in_channels`,
    `out_channels`, `kernel_size`, `stride=1`, `padding=0`, `dilation=1`,
    `groups=1`, `use_bias=True`, `padding_mode="ZEROS"`, `dtype=None`, `key`, `axes`.

    **Returns:** the layer, mapping `(in_channels, depth, height, width)` to
    `(out_channels, new_depth, new_height, new_width)`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> conv = fx.nn.Conv3d(1, 2, kernel_size=(1, 3, 3), key=jax.random.key(0))
    >>> conv(jnp.ones((1, 4, 8, 8))).shape
    (2, 4, 6, 6)

    ```
    """

    __init__ = _ConvNd.__init__  # restated: type checkers see its signature

    _num_spatial_dims = 3


class ConvTranspose(Module):
    """A transposed convolution over `num_spatial_dims` spatial dimensions.

    It goes the opposite way to the [`Conv`][filterax.nn.Conv] built with the same
    `kernel_size`, `stride`, `padding`, `dilation` and `groups` and the channel
    counts swapped: from that convolution's output shape back to its input shape,
    with the same connectivity. With the weight `conv.weight` flipped along its
    spatial axes and its two channel axes swapped (per group), it computes exactly
    the transpose (adjoint) of that linear map. Since a strided convolution maps
    several input sizes to one output size, `output_padding` picks the larger
    ones: with explicit padding it adds that many rows at the end; with `'SAME'`
    padding the output size is `stride * size - output_padding`.

    The weight has shape `(out_channels, in_channels // groups, *kernel_size)` and
    is initialised as `Conv`'s.

    **Arguments:**

    - `num_spatial_dims`: how many spatial dimensions the input has.
    - `in_channels`, `out_channels`: channel counts of the input and output.
    - `kernel_size`: the size of the kernel, an int or one int per dimension.
    - `stride`, `padding`, `dilation`: those of the matching `Conv` (same forms).
    - `output_padding`: an int or one per dimension, each smaller than the
      stride; a negative one removes rows at the end instead.
    - `groups`: split the channels into this many independent groups; both
      `in_channels` and `out_channels` must be divisible by it.
    - `use_bias`: whether to add a bias.
    - `padding_mode`: the matching `Conv`'s: `'ZEROS'`, or `'CIRCULAR'` (only with
      `'SAME'`/`'SAME_LOWER'` padding and zero `output_padding`).
    - `dtype`: dtype of the parameters, floating or complex; defaults to
      `float32` (`float64` when JAX's x64 mode is on).
    - `key`: a PRNG key for the initialisation (keyword only).
    - `axes`: logical axes replacing the defaults for this layer, by field name
      (keyword only). The defaults are `weight: ("out", "in", None, ...)` and
      `bias: ("out", None, ...)`: the kernel's spatial dimensions are small and
      never split. See [`sharding_of`][filterax.sharding_of].

    **Returns:** the layer. Calling it on `x` of shape `(in_channels, *spatial)`
    returns an array of shape `(out_channels, *new_spatial)`.

    **Raises:** `ValueError` for a malformed argument, `output_padding >= stride`
    or channel counts not divisible by `groups`; `NotImplementedError` for the
    padding modes listed above as unsupported.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> up = fx.nn.ConvTranspose(
    ...     2, 8, 3, kernel_size=3, stride=2, padding=1, output_padding=1,
    ...     key=jax.random.key(0),
    ... )
    >>> up(jnp.ones((8, 16, 16))).shape
    (3, 32, 32)

    ```
    """

    num_spatial_dims: int = field(static=True)
    weight: Inexact[Array, "out_channels in_channels_per_group *kernel_size"]
    bias: Inexact[Array, "out_channels ..."] | None
    in_channels: int = field(static=True)
    out_channels: int = field(static=True)
    kernel_size: tuple[int, ...] = field(static=True)
    stride: tuple[int, ...] = field(static=True)
    padding: Padding = field(static=True)
    output_padding: tuple[int, ...] = field(static=True)
    dilation: tuple[int, ...] = field(static=True)
    groups: int = field(static=True)
    use_bias: bool = field(static=True)
    padding_mode: str = field(static=True)
    axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = axes_overrides_field()

    def __init__(
        self,
        num_spatial_dims: int,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: PaddingLike = 0,
        output_padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        use_bias: bool = True,
        padding_mode: str = "ZEROS",
        dtype: DTypeLike | None = None,
        *,
        key: PRNGKeyArray,
        axes: dict[str, tuple[str | None, ...]] | None = None,
    ):
        n = num_spatial_dims
        kernel_size = parse_ints(kernel_size, n, "kernel_size", 1)
        stride = parse_ints(stride, n, "stride", 1)
        # A negative `output_padding` crops the output (as in Equinox).
        output_padding = parse_ints(output_padding, n, "output_padding", None)
        if any(o >= s for o, s in zip(output_padding, stride)):
            raise ValueError(
                "`output_padding` must be smaller than `stride` in every dimension, "
                f"got output_padding={output_padding} and stride={stride}."
            )
        padding = _parse_padding(padding, n)
        padding_mode = _parse_padding_mode(padding_mode)
        if padding_mode in ("REFLECT", "REPLICATE"):
            raise NotImplementedError(
                f"ConvTranspose does not support padding_mode={padding_mode!r}; "
                "use 'ZEROS' or 'CIRCULAR'."
            )
        if padding_mode == "CIRCULAR" and (
            padding not in ("SAME", "SAME_LOWER") or any(output_padding)
        ):
            raise NotImplementedError(
                "ConvTranspose supports padding_mode='CIRCULAR' only with padding "
                "'SAME' or 'SAME_LOWER' and zero `output_padding`, got "
                f"padding={padding!r} and output_padding={output_padding}."
            )
        _check_groups(in_channels, out_channels, groups)
        self.weight, self.bias = _init_weight_and_bias(
            key, in_channels, out_channels, kernel_size, groups, use_bias, dtype
        )
        self.axes = _conv_axes(type(self).__name__, axes, len(kernel_size))
        self.num_spatial_dims = n
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        self.output_padding = output_padding
        self.dilation = parse_ints(dilation, n, "dilation", 1)
        self.groups = groups
        self.use_bias = use_bias
        self.padding_mode = padding_mode

    def _transposed_padding(self) -> list[tuple[int, int]]:
        """Padding of the stride-dilated input that makes the convolution the
        transpose of the matching `Conv` (Dumoulin & Visin, arXiv:1603.07285,
        relationship 14)."""
        pairs = []
        for k, s, a, d, index in zip(
            self.kernel_size,
            self.stride,
            self.output_padding,
            self.dilation,
            range(self.num_spatial_dims),
        ):
            span = d * (k - 1)
            if self.padding == "VALID":
                before, after = 0, 0
            elif isinstance(self.padding, str):
                # The matching `Conv`'s 'SAME' padding for an input of size
                # `s * n - a`; when the kernel is narrower than the stride that
                # padding is zero and the leftover rows go to the end instead.
                total = span + 1 - s + a
                if total < 0:
                    a, total = -total, 0
                else:
                    a = 0
                before = (
                    (total + 1) // 2 if self.padding == "SAME_LOWER" else total // 2
                )
                after = total - before
            else:
                before, after = self.padding[index]
            pairs.append((span - before, span - after + a))
        return pairs

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Applies the transposed convolution to `x`.

        **Arguments:**

        - `x`: an array of shape `(in_channels, *spatial)`.
        - `key`: ignored; accepted so that all layers can be called alike.

        **Returns:** an array of shape `(out_channels, *new_spatial)`.

        ```python
        >>> import jax, jax.numpy as jnp
        >>> import filterax as fx
        >>> up = fx.nn.ConvTranspose(1, 4, 2, kernel_size=4, stride=2, padding="SAME",
        ...                          key=jax.random.key(0))
        >>> up(jnp.ones((4, 10))).shape
        (2, 20)

        ```
        """
        del key
        check_input(self, x, self.num_spatial_dims, self.in_channels)
        with jax.named_scope(f"filterax.nn.{type(self).__name__}"):
            padding = self._transposed_padding()
            if self.padding_mode == "CIRCULAR":
                # Whole multiples of the stride are real input elements wrapped
                # round; only the remainder is zeros between dilated elements.
                wrap = [(lo // s, hi // s) for (lo, hi), s in zip(padding, self.stride)]
                x = jnp.pad(x, [(0, 0), *wrap], mode="wrap")
                padding = [
                    (lo % s, hi % s) for (lo, hi), s in zip(padding, self.stride)
                ]
            ones = (1,) * self.num_spatial_dims
            return _convolve(self, x, ones, padding, lhs_dilation=self.stride)


class _ConvTransposeNd(ConvTranspose):
    """`ConvTranspose` with `num_spatial_dims` fixed by the subclass."""

    _num_spatial_dims: ClassVar[int]

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        output_padding: int | Sequence[int] = 0,
        padding: PaddingLike = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        use_bias: bool = True,
        padding_mode: str = "ZEROS",
        dtype: DTypeLike | None = None,
        *,
        key: PRNGKeyArray,
        axes: dict[str, tuple[str | None, ...]] | None = None,
    ):
        super().__init__(
            self._num_spatial_dims,
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            output_padding,
            dilation,
            groups,
            use_bias,
            padding_mode,
            dtype,
            key=key,
            axes=axes,
        )


class ConvTranspose1d(_ConvTransposeNd):
    """A one-dimensional transposed convolution:
    [`ConvTranspose`][filterax.nn.ConvTranspose] with `num_spatial_dims=1`.

    **Arguments:** as for `ConvTranspose`, without `num_spatial_dims` and with
    `output_padding` third (as in Equinox): `in_channels`, `out_channels`,
    `kernel_size`, `stride=1`, `output_padding=0`, `padding=0`, `dilation=1`,
    `groups=1`, `use_bias=True`, `padding_mode="ZEROS"`, `dtype=None`, `key`, `axes`.

    **Returns:** the layer, mapping `(in_channels, length)` to
    `(out_channels, new_length)`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> up = fx.nn.ConvTranspose1d(4, 2, kernel_size=3, key=jax.random.key(0))
    >>> up(jnp.ones((4, 8))).shape
    (2, 10)

    ```
    """

    __init__ = _ConvTransposeNd.__init__  # restated: type checkers see its signature

    _num_spatial_dims = 1


class ConvTranspose2d(_ConvTransposeNd):
    """A two-dimensional transposed convolution:
    [`ConvTranspose`][filterax.nn.ConvTranspose] with `num_spatial_dims=2`.

    **Arguments:** as for `ConvTranspose`, without `num_spatial_dims` and with
    `output_padding` third (as in Equinox): `in_channels`, `out_channels`,
    `kernel_size`, `stride=1`, `output_padding=0`, `padding=0`, `dilation=1`,
    `groups=1`, `use_bias=True`, `padding_mode="ZEROS"`, `dtype=None`, `key`, `axes`.

    **Returns:** the layer, mapping `(in_channels, height, width)` to
    `(out_channels, new_height, new_width)`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> up = fx.nn.ConvTranspose2d(8, 3, 3, stride=2, output_padding=1, padding=1,
    ...                            key=jax.random.key(0))
    >>> up(jnp.ones((8, 16, 16))).shape
    (3, 32, 32)

    ```
    """

    __init__ = _ConvTransposeNd.__init__  # restated: type checkers see its signature

    _num_spatial_dims = 2


class ConvTranspose3d(_ConvTransposeNd):
    """A three-dimensional transposed convolution:
    [`ConvTranspose`][filterax.nn.ConvTranspose] with `num_spatial_dims=3`.

    **Arguments:** as for `ConvTranspose`, without `num_spatial_dims` and with
    `output_padding` third (as in Equinox): `in_channels`, `out_channels`,
    `kernel_size`, `stride=1`, `output_padding=0`, `padding=0`, `dilation=1`,
    `groups=1`, `use_bias=True`, `padding_mode="ZEROS"`, `dtype=None`, `key`, `axes`.

    **Returns:** the layer, mapping `(in_channels, depth, height, width)` to
    `(out_channels, new_depth, new_height, new_width)`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> up = fx.nn.ConvTranspose3d(2, 1, kernel_size=2, stride=2, key=jax.random.key(0))
    >>> up(jnp.ones((2, 3, 4, 5))).shape
    (1, 6, 8, 10)

    ```
    """

    __init__ = _ConvTransposeNd.__init__  # restated: type checkers see its signature

    _num_spatial_dims = 3
