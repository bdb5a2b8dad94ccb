"""`Stacked`: many layers of one structure, stored with their arrays stacked
and applied with one scan, so that tracing and compiling do not grow with
depth."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, Generic, SupportsIndex, TypeVar, cast, overload

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import PRNGKeyArray

from .._ad import filter_checkpoint
from .._control import filter_scan
from .._mapping import filter_vmap, if_array
from .._module import Module, field
from .._rng import RngStream
from .._tree._filters import is_array, is_ref
from .._tree._structure import array_text, describe_value, path_text, tree_diff
from ._stateful import State

__all__ = ["Stacked"]

_Layer = TypeVar("_Layer", bound=Callable[..., Any])

# The errors JAX raises when a function needs the value of a traced array, as
# `make` does when its key decides the layer's structure.
_NEEDS_VALUE_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.TracerArrayConversionError,
)


class _Prebuilt:
    """Passed as `make` by `Stacked`'s own methods: the layers are already
    stacked, so `__init__` stores them as they are."""

    __slots__ = ("layers",)

    def __init__(self, layers: Any):
        self.layers = layers

    def __call__(self, key: Any) -> Any:
        raise AssertionError("never called: `Stacked.__init__` takes its layers")


_NO_KEY: Any = None


class _LayerArray:
    """How `tree_pformat` shows a stacked array: the shape of one layer's."""

    __slots__ = ("text",)

    def __init__(self, array: Any):
        self.text = array_text(array.shape[1:], array.dtype)

    def __tree_pformat__(self) -> str:
        return self.text


def _check_no_refs(layer: Any, where: str, who: str) -> None:
    for path, leaf in jtu.tree_flatten_with_path(layer)[0]:
        if is_ref(leaf):
            raise ValueError(
                f"{who}: {path_text(where, path)} is a jax.Ref (an RngStream's "
                "counter, for example). Stacked layers cannot own Refs: a Ref is "
                "shared, not stacked. Pass an RngStream when calling instead: "
                "`stacked(x, key=stream)`."
            )


def _stack_layers(layers: Sequence[Any], who: str, hint: str = "") -> Any:
    """One layer whose arrays are those of `layers` stacked on a new axis 0,
    after checking that they agree in structure, static leaves, shapes and
    dtypes (naming the first layer and key path that does not)."""
    first = layers[0]
    _check_no_refs(first, "layers[0]", who)
    for position, layer in enumerate(layers[1:], start=1):
        differences = tree_diff(first, layer, compare_values=False, max_differences=1)
        if differences:
            difference = differences[0]
            raise ValueError(
                f"{who}: layer {position} differs from layer 0 at "
                f"{difference.where(f'layers[{position}]')}: {difference.detail} "
                f"(layer 0 vs layer {position}). Stacked layers share one structure: "
                "the same classes, static fields and non-array leaves, and arrays "
                f"of the same shapes and dtypes.{hint}"
            )
        _check_no_refs(layer, f"layers[{position}]", who)

    def stack(*leaves: Any) -> Any:
        return jnp.stack(leaves) if is_array(leaves[0]) else leaves[0]

    return jtu.tree_map(stack, *layers)


class Stacked(Module, Generic[_Layer]):
    """`num` layers of one structure, stored as one layer whose arrays have a
    leading axis of length `num`, and applied one after the other by a scan.

    An unrolled Python loop over 48 transformer blocks gives JAX and XLA a
    program 48 times as long, and compiling it takes minutes; `Stacked` traces
    and compiles one block, whatever the depth, with the same results and the
    same step time. The layers are built by `make(key)` under
    [`filter_vmap`][filterax.filter_vmap] (their arrays stacked, their static
    parts shared) and applied with [`filter_scan`][filterax.filter_scan].

    Calling `stacked(x, *args, **kwargs)` applies layer 0 to `x`, layer 1 to
    its output, and so on; the output of a layer must have the structure,
    shapes and dtypes of its input. `args` and `kwargs` reach every layer
    unchanged, except:

    - a [`State`][filterax.nn.State] as the first extra argument (or
      `state=`): each layer is called as `layer(x, state, ...)` and must
      return `(x, state)`; it reads and writes its own entries of the state
      (built with [`make_with_state`][filterax.nn.make_with_state], the
      entries of stacked layers hold stacked values), and the call returns
      `(x, state)`;
    - `key=`: a PRNG key is split into `num` keys, layer `i` getting the
      `i`-th (as [`Sequential`][filterax.nn.Sequential] does); an
      [`RngStream`][filterax.RngStream] is passed to every layer, each drawing
      fresh keys from it in turn; `None` is passed as it is. (JAX 0.10.2
      cannot differentiate a scan that writes a Ref made inside the function
      being differentiated: make the stream, or `stream.split(n)`, outside
      it.)

    The stacked arrays carry the logical axis `"stack"` first: they have one
    dimension more than the layer declares. A layer cannot own a `jax.Ref`
    (such as an `RngStream`): pass the stream when calling.

    **Arguments:**

    - `make`: `make(key) -> layer`, building one layer. It is traced once,
      under `filter_vmap`. If it needs the value of its key (to choose a
      size, say), the layers are built one by one instead, and must still
      agree in structure.
    - `num`: the number of layers, at least 1.
    - `key`: the PRNG key, split into one key per layer (keyword only).
    - `remat`: `True` to recompute each layer's activations in the backward
      pass rather than storing them ([`filter_checkpoint`][filterax.filter_checkpoint]),
      or a `jax.checkpoint` policy (from `jax.checkpoint_policies`) saying
      which to keep; `False` stores them as usual. Layers then cannot write
      Refs (an `RngStream` key): pass a PRNG key.
    - `unroll`: how many layers each iteration of the scan applies, as for
      `jax.lax.scan`.

    **Returns:** the stack, a Module. `len(stacked)` is `num`; `stacked[i]` is
    layer `i` (negative indices count from the end), a plain layer;
    `stacked[a:b]` a smaller `Stacked` (a slice selecting no layer is
    refused with an `IndexError`); [`unstack`][filterax.nn.Stacked.unstack]
    and [`from_layers`][filterax.nn.Stacked.from_layers] convert to and from a
    list of layers.

    **Raises:** `ValueError` when `num` is below 1, or when `make` needs its
    key's value and builds layers of different structures (naming the layer
    and key path); `TypeError` when `make` does not return a callable.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> make = lambda key: fx.nn.Linear(4, 4, key=key)
    >>> stacked = fx.nn.Stacked(make, 3, key=jax.random.key(0))
    >>> print(fx.tree_pformat(stacked, width=100))
    Stacked(3 x Linear(weight=f32[4,4], bias=f32[4], in_features=4, out_features=4, use_bias=True))
    >>> len(stacked), stacked.layers.weight.shape, stacked[0].weight.shape
    (3, (3, 4, 4), (4, 4))
    >>> x = jnp.ones(4)
    >>> unrolled = stacked[2](stacked[1](stacked[0](x)))
    >>> bool(jnp.allclose(stacked(x), unrolled, atol=1e-6))
    True

    ```
    """

    layers: _Layer
    num: int = field(static=True)
    remat: bool | Callable[..., bool] = field(static=True)
    unroll: int | bool = field(static=True)

    def __init__(
        self,
        make: Callable[[PRNGKeyArray], _Layer],
        num: int,
        *,
        key: PRNGKeyArray,
        remat: bool | Callable[..., bool] = False,
        unroll: int | bool = 1,
    ):
        if isinstance(num, bool) or not isinstance(num, int):
            raise TypeError(f"nn.Stacked: `num` must be an int, got {num!r}.")
        if not isinstance(remat, bool) and not callable(remat):
            raise TypeError(
                "nn.Stacked: `remat` must be a bool or a jax.checkpoint policy, got "
                f"{remat!r}."
            )
        layers: Any
        if isinstance(make, _Prebuilt):
            layers = make.layers
        else:
            if num < 1:
                raise ValueError(f"nn.Stacked: `num` must be at least 1, got {num}.")
            if not callable(make):
                raise TypeError(
                    f"nn.Stacked: `make` must be a function `key -> layer`, got {make!r}."
                )
            layers = _build(make, num, key)
            if not callable(layers):
                raise TypeError(
                    "nn.Stacked: `make(key)` must return a layer (a callable); it "
                    f"returned {describe_value(layers)}."
                )
        self.layers = cast(_Layer, layers)
        self.num = num
        self.remat = remat
        self.unroll = unroll

    @classmethod
    def from_layers(
        cls,
        layers: Sequence[_Layer],
        *,
        remat: bool | Callable[..., bool] = False,
        unroll: int | bool = 1,
    ) -> Stacked[_Layer]:
        """A stack of the given layers, the inverse of
        [`unstack`][filterax.nn.Stacked.unstack].

        Useful to load a checkpoint of an unrolled model into the stacked form
        (and back, with `unstack`).

        **Arguments:**

        - `layers`: a non-empty sequence of layers with one structure: the same
          classes, static fields and non-array leaves, and arrays of the same
          shapes and dtypes.
        - `remat`, `unroll`: as for `Stacked`.

        **Returns:** the `Stacked`, whose layer `i` is `layers[i]`.

        **Raises:** `ValueError` when `layers` is empty, when a layer differs
        from layer 0 (naming the layer and key path), or holds a `jax.Ref`.

        ```python
        >>> import jax, jax.numpy as jnp
        >>> import filterax as fx
        >>> keys = jax.random.split(jax.random.key(0), 2)
        >>> layers = [fx.nn.Linear(3, 3, key=k) for k in keys]
        >>> stacked = fx.nn.Stacked.from_layers(layers)
        >>> stacked.layers.weight.shape
        (2, 3, 3)
        >>> bool(fx.tree_equal(stacked.unstack(), layers))
        True
        >>> fx.nn.Stacked.from_layers([layers[0], fx.nn.Linear(3, 2, key=keys[0])])
        Traceback (most recent call last):
        ...
        ValueError: nn.Stacked.from_layers: layer 1 differs from layer 0 at layers[1].out_features: static field 3 vs 2 ...

        ```
        """
        layers = list(layers)
        if not layers:
            raise ValueError(
                "nn.Stacked.from_layers: got no layers; a stack needs at least one "
                "(its structure is that of its layers)."
            )
        stacked = _stack_layers(layers, "nn.Stacked.from_layers")
        return cls(
            _Prebuilt(stacked), len(layers), key=_NO_KEY, remat=remat, unroll=unroll
        )

    def unstack(self) -> list[_Layer]:
        """The layers, as a list of plain layers (arrays without the stacking
        axis); `Stacked.from_layers` turns it back.

        **Returns:** a list of `len(self)` layers.

        ```python
        >>> import jax
        >>> import filterax as fx
        >>> stacked = fx.nn.Stacked(lambda k: fx.nn.Linear(2, 2, key=k), 3, key=jax.random.key(0))
        >>> [layer.weight.shape for layer in stacked.unstack()]
        [(2, 2), (2, 2), (2, 2)]

        ```
        """
        return [self[position] for position in range(self.num)]

    def __len__(self) -> int:
        return self.num

    @overload
    def __getitem__(self, index: SupportsIndex) -> _Layer: ...

    @overload
    def __getitem__(self, index: slice) -> Stacked[_Layer]: ...

    def __getitem__(self, index: SupportsIndex | slice) -> Any:
        if isinstance(index, slice):
            count = len(range(self.num)[index])
            if count == 0:
                raise IndexError(
                    f"nn.Stacked: the slice [{_slice_text(index)}] selects no "
                    f"layer of a stack of {self.num}; a stack holds at least one "
                    "layer (an empty one would return its input unchanged)."
                )
            layers = jtu.tree_map(
                lambda leaf: leaf[index] if is_array(leaf) else leaf, self.layers
            )
            return Stacked(
                _Prebuilt(layers),
                count,
                key=_NO_KEY,
                remat=self.remat,
                unroll=self.unroll,
            )
        try:
            position = operator.index(index)
        except TypeError:
            raise TypeError(
                "nn.Stacked can be indexed with an int (one layer) or a slice (a "
                f"smaller Stacked), not {type(index).__name__}."
            ) from None
        if not -self.num <= position < self.num:
            raise IndexError(
                f"nn.Stacked: index {position} is out of range for a stack of "
                f"{self.num} layers."
            )
        position %= self.num
        return jtu.tree_map(
            lambda leaf: leaf[position] if is_array(leaf) else leaf, self.layers
        )

    def __getattr__(self, name: str) -> Any:
        # Called only when `name` is not found: points at `.layers` when the
        # layers have it.
        message = f"'Stacked' object has no attribute {name!r}"
        if name.startswith("__"):
            raise AttributeError(message)
        try:
            layers = object.__getattribute__(self, "layers")
        except AttributeError:
            raise AttributeError(message) from None
        if hasattr(layers, name):
            stacked = (
                f", arrays with a leading axis of length {self.num}, one entry "
                "per layer"
                if any(map(is_array, jtu.tree_leaves(getattr(layers, name))))
                else ""
            )
            raise AttributeError(
                f"{message}: the layers' attributes live under `.layers` "
                f"(`stacked.layers.{name}`{stacked}), or index one layer: "
                f"`stacked[0].{name}`."
            )
        raise AttributeError(
            f"{message} (its fields: layers, num, remat, unroll; the layers, "
            f"{type(layers).__name__}s, have no attribute {name!r} either)."
        )

    def __tree_pformat__(self) -> tuple[str, list[tuple[str, Any]]]:
        one_layer = jtu.tree_map(
            lambda leaf: _LayerArray(leaf) if is_array(leaf) else leaf, self.layers
        )
        children: list[tuple[str, Any]] = [(f"{self.num} x ", one_layer)]
        if self.remat is not False:
            children.append(("remat=", self.remat))
        if self.unroll != 1:
            children.append(("unroll=", self.unroll))
        return "Stacked", children

    def __call__(self, x: Any, /, *args: Any, **kwargs: Any) -> Any:
        """Applies the layers in order, each to the output of the one before.

        **Arguments:**

        - `x`: the input of layer 0: an array or pytree of arrays; each layer's
          output must match it in structure, shapes and dtypes.
        - `*args`, `**kwargs`: passed to every layer. A `State` first in
          `args` (or as `state=`) is threaded through the layers; `key=` is
          split between the layers (a PRNG key) or shared (an `RngStream`),
          as the class docstring says.

        **Returns:** the last layer's output; `(output, state)` when a `State`
        was passed.

        **Raises:** `TypeError` naming the key path when a layer's output
        differs from its input, or a layer called with a `State` does not
        return `(x, state)`; `ValueError` when `remat` is on and `key` is an
        `RngStream`.

        ```python
        >>> import jax, jax.numpy as jnp
        >>> import filterax as fx
        >>> make = lambda key: fx.nn.Sequential([fx.nn.Linear(2, 2, key=key), fx.nn.Dropout(0.5)])
        >>> stacked = fx.nn.Stacked(make, 4, key=jax.random.key(0))
        >>> stacked(jnp.ones(2), key=jax.random.key(1)).shape
        (2,)
        >>> stacked(jnp.ones(2), key=fx.RngStream(0)).shape
        (2,)

        ```
        """
        state: State | None = None
        state_by_keyword = False
        if args and isinstance(args[0], State):
            state, args = args[0], args[1:]
        elif isinstance(kwargs.get("state"), State):
            kwargs = dict(kwargs)
            state = kwargs.pop("state")
            state_by_keyword = True
        keys = None
        shared_key: Any = None
        has_key = "key" in kwargs
        if has_key:
            kwargs = dict(kwargs)
            key = kwargs.pop("key")
            if key is None or isinstance(key, RngStream):
                shared_key = key
                if self.remat is not False and key is not None:
                    raise ValueError(
                        "nn.Stacked(remat=...): the layers were given an RngStream "
                        "as `key`, but a recomputed layer cannot draw from a stream "
                        "(the backward pass would draw again). Pass a PRNG key, "
                        "which is split into one key per layer, or remat=False."
                    )
            else:
                keys = jax.random.split(key, self.num)
        layer_state = None if state is None else state.substate(self.layers)

        def apply(
            layer: Any,
            x: Any,
            layer_state: State | None,
            layer_key: Any,
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
        ) -> Any:
            kwargs = dict(kwargs)
            if has_key:
                kwargs["key"] = layer_key
            if layer_state is None:
                return layer(x, *args, **kwargs)
            if state_by_keyword:
                return layer(x, *args, state=layer_state, **kwargs)
            return layer(x, layer_state, *args, **kwargs)

        if self.remat is not False:
            policy = None if self.remat is True else self.remat
            # Inside a scan, common-subexpression elimination cannot undo the
            # recomputation, so `prevent_cse` is not needed (see jax.checkpoint).
            apply = filter_checkpoint(apply, prevent_cse=False, policy=policy)

        def step(x: Any, per_layer: tuple[Any, Any, Any]) -> tuple[Any, Any]:
            layer, one_state, one_key = per_layer
            out = apply(
                layer,
                x,
                one_state,
                shared_key if keys is None else one_key,
                args,
                kwargs,
            )
            new_state = None
            if state is not None:
                if not (
                    isinstance(out, tuple)
                    and len(out) == 2
                    and isinstance(out[1], State)
                ):
                    raise TypeError(
                        "nn.Stacked: called with a State, each layer must return "
                        f"`(x, state)`; layer 0 returned {describe_value(out)}."
                    )
                out, new_state = out
            _check_output(x, out)
            return out, new_state

        x, new_state = filter_scan(
            step,
            x,
            (self.layers, layer_state, keys),
            length=self.num,
            unroll=self.unroll,
        )
        if state is None:
            return x
        return x, state.update(new_state)


def _slice_text(index: slice) -> str:
    parts = [
        "" if part is None else str(part)
        for part in (index.start, index.stop, index.step)
    ]
    return ":".join(parts if index.step is not None else parts[:2])


def _check_output(x: Any, out: Any) -> None:
    differences = tree_diff(x, out, compare_values=False, max_differences=1)
    if differences:
        difference = differences[0]
        raise TypeError(
            "nn.Stacked: the output of a layer is the input of the next, so it must "
            "have the structure, non-array leaves, shapes and dtypes of its input; "
            f"layer 0 (traced once for every layer) differs at "
            f"{difference.where('x')}: {difference.detail} (input vs output)."
        )


def _build(make: Callable[[Any], Any], num: int, key: Any) -> Any:
    """`num` layers from `make`, stacked: traced once under `filter_vmap`, or
    built one by one when `make` needs its key's value."""
    keys = jax.random.split(key, num)
    try:
        return filter_vmap(make, out_axes=if_array(0))(keys)
    except _NEEDS_VALUE_ERRORS:
        pass
    # `make` reads its key (to choose a size, say): build each layer eagerly
    # and check that they still agree, naming the first that does not.
    layers = [make(layer_key) for layer_key in keys]
    return _stack_layers(
        layers,
        "nn.Stacked",
        " `make` read the value of its key, so the layers were built one by one "
        "from the keys `jax.random.split(key, num)`: let the key choose only "
        "array values, not sizes, types or static fields.",
    )
