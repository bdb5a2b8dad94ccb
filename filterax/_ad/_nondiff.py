"""`NonDifferentiable`: a marker that keeps values dynamic but out of autodiff."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np
from jax.core import Tracer

from .._pretty import tree_pformat
from .._tree._filters import is_inexact_array, partition
from .._tree._split import FROZEN_NODE_TYPES
from .._tree._utilities import tree_at

__all__ = [
    "NonDifferentiable",
    "freeze",
    "is_non_differentiable",
    "partition_differentiable",
    "trainable",
    "unfreeze",
    "unfrozen",
]


def _stop_gradient_leaf(leaf: Any) -> Any:
    # Only tracers can carry a perturbation; skipping concrete arrays keeps
    # `.value` free of device dispatches outside of transforms.
    if isinstance(leaf, Tracer) and is_inexact_array(leaf):
        return jax.lax.stop_gradient(leaf)
    return leaf


def unfrozen(x: Any) -> Any:
    """`x`, or its `.value` (gradients stopped) if it is a `NonDifferentiable`:
    for operands that JAX functions must see as arrays. The wrapper's
    operators use it, and so do `nn` layers passing a parameter to `lax`."""
    return x.value if isinstance(x, NonDifferentiable) else x


def _binary(
    op: Callable[[Any, Any], Any],
) -> tuple[Callable[[Any, Any], Any], Callable[[Any, Any], Any]]:
    def forward(self: NonDifferentiable, other: Any) -> Any:
        return op(self.value, unfrozen(other))

    def reflected(self: NonDifferentiable, other: Any) -> Any:
        return op(unfrozen(other), self.value)

    return forward, reflected


def _unary(op: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def apply(self: NonDifferentiable) -> Any:
        return op(self.value)

    return apply


class _NonDifferentiableType(type):
    # JAX's pytree mismatch errors show the class, and the usual mismatch is an
    # optimiser state built from `filter(model, is_inexact_array)` (which keeps
    # the wrapper) meeting gradients (which hold None there): say what to do.
    def __repr__(cls) -> str:
        return (
            "<class 'filterax.NonDifferentiable'> (frozen values hold no "
            "parameters: build optimiser states and updates from "
            "`filterax.trainable(model)`, where they are None, not from "
            "`filter(model, is_inexact_array)`)"
        )


class NonDifferentiable(metaclass=_NonDifferentiableType):
    """Marks a value (array, scalar or whole pytree) as never differentiated.

    It is a pytree node whose single child is the wrapped value, so
    [`filter_jit`][filterax.filter_jit] traces the arrays inside (changing them
    never recompiles) and [`filter_vmap`][filterax.filter_vmap] batches them.
    Every filtered differentiation transform treats its contents as constants:
    their gradient, cotangent or tangent is `None`.

    `.value` returns the contents with `jax.lax.stop_gradient` applied to inexact
    arrays, so even plain `jax.grad` sees a zero gradient through it. Arithmetic,
    comparisons, indexing, `.shape`, `.dtype` and `numpy.asarray` delegate to
    `.value`; so do calls and attribute reads, so a frozen layer (say the first
    of an `nn.Sequential`, or `model.encoder`) is used exactly as before.

    **Arguments:**

    - `value`: anything.

    **Returns:** the wrapper, a pytree node whose child is `value`.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> buffer = fx.NonDifferentiable(jnp.arange(3.0))
    >>> buffer
    NonDifferentiable(f32[3])
    >>> buffer + 1.0
    Array([1., 2., 3.], dtype=float32)
    >>> fx.filter_grad(lambda b: (b * 2.0).sum())(buffer) is None
    True

    ```
    """

    __slots__ = ("_value",)

    def __treescope_repr__(self, path: str | None, subtree_renderer: Any) -> Any:
        """Treescope's display hook (the optional extra): shown by name, with
        array summaries, even before a Module has been displayed."""
        # Imported here: `import filterax` must not import treescope.
        from .._treescope import render_constructor

        return render_constructor(self, {"value": self.value}, path, subtree_renderer)

    def __init__(self, value: Any):
        object.__setattr__(self, "_value", value)

    @property
    def value(self) -> Any:
        """The wrapped value, with `stop_gradient` applied to inexact arrays."""
        return jtu.tree_map(_stop_gradient_leaf, self._value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("NonDifferentiable is immutable.")

    def __repr__(self) -> str:
        return tree_pformat(self)

    def __tree_pformat__(self) -> tuple[str, list[tuple[str, Any]]]:
        return "NonDifferentiable", [("", self._value)]

    @property
    def shape(self) -> tuple[int, ...]:
        return np.shape(self._value)

    @property
    def dtype(self) -> Any:
        return self._value.dtype

    @property
    def ndim(self) -> int:
        return np.ndim(self._value)

    @property
    def size(self) -> int:
        return int(np.size(self._value))

    def __len__(self) -> int:
        return len(self._value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.value(*args, **kwargs)

    def __reduce__(self) -> tuple[type, tuple[Any]]:
        # `copy`, `deepcopy` and `pickle` rebuild through `__init__`: the
        # default protocol would assign the slot, which `__setattr__` refuses.
        return NonDifferentiable, (self._value,)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the wrapper lacks. Dunder names are never
        # delegated: Python, NumPy and JAX probe for protocols (`__jax_array__`,
        # `__copy__`...) that a wrapper must not appear to implement.
        if name.startswith("__") or name == "_value":
            raise AttributeError(name)
        return getattr(self.value, name)

    def __getitem__(self, index: Any) -> Any:
        return self.value[index]

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        return np.asarray(self._value, dtype=dtype)

    __add__, __radd__ = _binary(operator.add)
    __sub__, __rsub__ = _binary(operator.sub)
    __mul__, __rmul__ = _binary(operator.mul)
    __truediv__, __rtruediv__ = _binary(operator.truediv)
    __floordiv__, __rfloordiv__ = _binary(operator.floordiv)
    __mod__, __rmod__ = _binary(operator.mod)
    __pow__, __rpow__ = _binary(operator.pow)
    __matmul__, __rmatmul__ = _binary(operator.matmul)
    __and__, __rand__ = _binary(operator.and_)
    __or__, __ror__ = _binary(operator.or_)
    __xor__, __rxor__ = _binary(operator.xor)
    __lt__, __gt__ = _binary(operator.lt)[0], _binary(operator.gt)[0]
    __le__, __ge__ = _binary(operator.le)[0], _binary(operator.ge)[0]
    __eq__, __ne__ = _binary(operator.eq)[0], _binary(operator.ne)[0]
    __neg__ = _unary(operator.neg)
    __pos__ = _unary(operator.pos)
    __abs__ = _unary(operator.abs)
    __invert__ = _unary(operator.invert)
    # Elementwise `==` makes the wrapper unhashable, like the arrays it holds.
    __hash__ = None  # type: ignore[assignment]


def _flatten_with_keys(node: NonDifferentiable) -> tuple[tuple, None]:
    return ((jtu.GetAttrKey("value"), node._value),), None


def _flatten(node: NonDifferentiable) -> tuple[tuple, None]:
    return (node._value,), None


def _unflatten(_: None, children: Iterable[Any]) -> NonDifferentiable:
    node = object.__new__(NonDifferentiable)
    (value,) = children
    object.__setattr__(node, "_value", value)
    return node


# Its value is set once, in `__init__` or `_unflatten`.
FROZEN_NODE_TYPES.add(NonDifferentiable)
jtu.register_pytree_with_keys(
    NonDifferentiable, _flatten_with_keys, _unflatten, flatten_func=_flatten
)


def is_non_differentiable(node: Any) -> bool:
    """Whether `node` is a [`NonDifferentiable`][filterax.NonDifferentiable]
    wrapper; handy as `is_leaf` to stop tree utilities at the wrappers.

    **Arguments:**

    - `node`: any Python object.

    **Returns:** a `bool`.

    ```python
    >>> import filterax as fx
    >>> fx.is_non_differentiable(fx.NonDifferentiable(1.0))
    True

    ```
    """
    return isinstance(node, NonDifferentiable)


def partition_differentiable(
    pytree: Any, differentiable: Callable[[Any], bool] = is_inexact_array
) -> tuple[Any, Any]:
    """Splits `pytree` into its differentiable leaves and everything else.

    A leaf is differentiable when `differentiable` says so (by default: an
    inexact array) and it is outside any `NonDifferentiable`. The first result
    holds those leaves and `None` elsewhere (a whole `NonDifferentiable` subtree
    becomes one `None`); the second holds the rest. `combine` of the two
    rebuilds `pytree`.
    """
    return partition(pytree, differentiable, is_leaf=is_non_differentiable)


def trainable(pytree: Any) -> Any:
    """The part of `pytree` that the filtered differentiation transforms act on.

    Keeps the inexact arrays outside any [`NonDifferentiable`][filterax.NonDifferentiable]
    and puts `None` everywhere else (a whole wrapper becomes one `None`), so it
    has exactly the structure of a [`filter_grad`][filterax.filter_grad] result.
    Initialise optimisers with it: `optimiser.init(fx.trainable(model))`.

    **Arguments:**

    - `pytree`: any pytree, typically a Module.

    **Returns:** a pytree of the same structure as `pytree`.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> params = {"w": jnp.ones(2), "buffer": fx.NonDifferentiable(jnp.zeros(2)), "n": 3}
    >>> fx.trainable(params)
    {'buffer': None, 'n': None, 'w': Array([1., 1.], dtype=float32)}

    ```
    """
    return partition_differentiable(pytree)[0]


def _none_or_wrapper(node: Any) -> bool:
    # `None` is selectable by `where`: freezing it wraps it like any value.
    return node is None or isinstance(node, NonDifferentiable)


def _wrap_once(node: Any) -> Any:
    return node if isinstance(node, NonDifferentiable) else NonDifferentiable(node)


def freeze(pytree: Any, where: Callable[[Any], Any]) -> Any:
    """Wraps the nodes selected by `where` in
    [`NonDifferentiable`][filterax.NonDifferentiable].

    **Arguments:**

    - `pytree`: the pytree (typically a Module) to modify.
    - `where`: a callable `pytree -> node` or `pytree -> sequence of nodes`, as for
      [`tree_at`][filterax.tree_at]. Nodes already wrapped are left as they are.

    **Returns:** a copy of `pytree` with the selected nodes wrapped.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> params = {"encoder": jnp.ones(2), "head": jnp.zeros(2)}
    >>> frozen = fx.freeze(params, lambda p: p["encoder"])
    >>> frozen["encoder"]
    NonDifferentiable(f32[2])
    >>> fx.freeze(frozen, lambda p: p["encoder"])["encoder"]
    NonDifferentiable(f32[2])

    ```
    """
    return tree_at(where, pytree, replace_fn=_wrap_once, is_leaf=_none_or_wrapper)


def unfreeze(pytree: Any) -> Any:
    """Removes every [`NonDifferentiable`][filterax.NonDifferentiable] wrapper.

    **Arguments:**

    - `pytree`: any pytree.

    **Returns:** `pytree` with each wrapper replaced by its contents.

    ```python
    >>> import filterax as fx
    >>> fx.unfreeze({"a": fx.NonDifferentiable(1.0), "b": 2.0})
    {'a': 1.0, 'b': 2.0}

    ```
    """

    def strip(node: Any) -> Any:
        if isinstance(node, NonDifferentiable):
            return unfreeze(node._value)
        return node

    return jtu.tree_map(strip, pytree, is_leaf=is_non_differentiable)
