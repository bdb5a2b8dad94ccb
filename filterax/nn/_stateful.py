"""Functional state, as in Equinox: `StateIndex` marks a piece of state inside a
model, `State` holds the current values apart from the model, and
`make_with_state` builds the pair.

A `State` is a pytree whose children are the state values, keyed by the
indices' markers. Each marker is either a string (the index's key path in the
model, assigned by `make_with_state`) or a plain `object()` (an index that was
never named). The markers are the pytree's auxiliary data, so two states from
two calls of `make_with_state` have the same treedef, and the key paths
(`DictKey(name)`, or `DictKey(position)` for unnamed markers) are the same in
every process, which is what serialisation checks.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import jax.numpy as jnp
import jax.tree_util as jtu
from typing_extensions import ParamSpec

from .._compat import same_structure
from .._module import Module, field
from .._precision import register_buffer_type
from .._pretty import tree_pformat
from .._sharding import register_state_types
from .._tree._utilities import tree_at

__all__ = ["State", "StateIndex", "delete_init_state", "make_with_state"]

_Value = TypeVar("_Value")
_P = ParamSpec("_P")
_T = TypeVar("_T")


class UnknownIndexError(ValueError, KeyError):
    """A `StateIndex` that is not part of the `State` asked. A `ValueError`,
    as filterax documents, and a `KeyError`, as Equinox raises."""

    __str__ = ValueError.__str__  # the message itself, not KeyError's quoted repr


class NotAStateError(TypeError, ValueError):
    """A `State` method given something other than a `StateIndex` (or, for
    `update`, a `State`). A `TypeError`, as filterax documents, and a
    `ValueError`, as Equinox raises."""


class _DeletedInit(Module):
    """Stands in for an index's initial value once `delete_init_state` (or
    `make_with_state`) has moved it into a `State`; it has no leaves."""


_DELETED = _DeletedInit()


class StateIndex(Module, Generic[_Value]):
    """Marks a piece of state in a model, and holds its initial value.

    Put one in a layer's field; read and write the current value with
    [`State.get`][filterax.nn.State.get] and
    [`State.set`][filterax.nn.State.set]. Build the model with
    [`make_with_state`][filterax.nn.make_with_state], which names every index
    after its position in the model and moves the initial values into the
    returned `State`.

    **Arguments:**

    - `init`: the initial value: an array, or a pytree of arrays.

    **Returns:** the index. Its `marker` (a static field) identifies it in a
    `State`; its `init` is the initial value, until `make_with_state` or
    [`delete_init_state`][filterax.nn.delete_init_state] removes it.

    **Raises:** `ValueError` when `init` is a function (the initial value is
    passed itself, not a function making it) or another `StateIndex`.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> class Counter(fx.Module):
    ...     index: fx.nn.StateIndex
    ...     def __init__(self):
    ...         self.index = fx.nn.StateIndex(jnp.array(0))
    ...     def __call__(self, state):
    ...         count = state.get(self.index)
    ...         return count, state.set(self.index, count + 1)
    >>> counter, state = fx.nn.make_with_state(Counter)()
    >>> _, state = counter(state)
    >>> count, state = counter(state)
    >>> int(count)
    1

    ```
    """

    marker: object = field(static=True)
    init: _Value

    def __init__(self, init: _Value):
        if isinstance(init, (types.FunctionType, types.MethodType)):
            raise ValueError(
                "StateIndex takes the initial value itself (an array or pytree of "
                "arrays), not a function that makes it: write StateIndex(value)."
            )
        if isinstance(init, StateIndex):
            raise ValueError("A StateIndex's initial value cannot be a StateIndex.")
        self.marker = object()
        self.init = init


def _is_index(x: Any) -> bool:
    return isinstance(x, StateIndex)


def _renamed(index: StateIndex, marker: str) -> StateIndex:
    """A copy of `index` with another marker: the only change ever made to a
    static field after construction, on a copy nobody else holds yet."""
    named = copy.copy(index)
    object.__setattr__(named, "marker", marker)
    return named


def _describe(marker: object, position: int) -> str:
    return marker if isinstance(marker, str) else f"<unnamed index #{position}>"


_STALE_STATE = (
    "This State was superseded: `set` or `update` returned a new State and marked "
    "this one as used, so that a model cannot go on from an outdated value by "
    "mistake (as in `x, s2 = layer(x, s1); y, s3 = layer(y, s1)`). Use the State "
    "that `set`/`update` returned. To keep an old State on purpose, copy it before "
    "it is used: `jax.tree.map(lambda v: v, state)`."
)


class State:
    """The current values of a model's [`StateIndex`][filterax.nn.StateIndex]es.

    A `State` is a pytree (its leaves are the state's arrays), so it can be
    passed through and returned from [`filter_jit`][filterax.filter_jit],
    mapped by [`filter_vmap`][filterax.filter_vmap], carried by
    `jax.lax.scan` and saved with
    [`tree_serialise_leaves`][filterax.tree_serialise_leaves]. It is used
    functionally: `set` and `update` return a new `State` and mark the old one
    as used, after which using it raises an error.

    **Arguments:**

    - `model`: a pytree; every `StateIndex` in it contributes its initial
      value. Usually the state comes from
      [`make_with_state`][filterax.nn.make_with_state] instead.

    **Returns:** the state.

    **Raises:** `ValueError` when an index's initial value was deleted (by
    `make_with_state` or `delete_init_state`).

    ```python
    >>> import jax
    >>> import filterax as fx
    >>> bn, state = fx.nn.make_with_state(fx.nn.BatchNorm)(3, "batch", mode="batch")
    >>> state
    State(BatchNorm.batch_counter=i32[], BatchNorm.batch_state_index=(f32[3], f32[3]))
    >>> [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(state)]
    ["['BatchNorm.batch_counter']", "['BatchNorm.batch_state_index'][0]", "['BatchNorm.batch_state_index'][1]"]

    ```
    """

    __slots__ = ("__weakref__", "_values")
    _values: dict[object, Any] | None

    def __treescope_repr__(self, path: str | None, subtree_renderer: Any) -> Any:
        """Treescope's display hook (the optional extra): shown by name, with
        array summaries, even before a Module has been displayed."""
        # Imported here: `import filterax` must not import treescope.
        from .._treescope import render_entries

        return render_entries(self, path, subtree_renderer)

    def __init__(self, model: Any):
        values: dict[object, Any] = {}
        for leaf in jtu.tree_leaves(model, is_leaf=_is_index):
            if not _is_index(leaf):
                continue
            if isinstance(leaf.init, _DeletedInit):
                raise ValueError(
                    "State(model): this model's initial state was already moved "
                    "out of it (by make_with_state or delete_init_state). Build the "
                    "model and its state together with "
                    "`model, state = filterax.nn.make_with_state(ModelClass)(...)`."
                )
            values[leaf.marker] = jtu.tree_map(jnp.asarray, leaf.init)
        self._values = values

    @classmethod
    def _from_values(cls, values: dict[object, Any]) -> State:
        state = object.__new__(cls)
        state._values = values
        return state

    def _live(self) -> dict[object, Any]:
        if self._values is None:
            raise ValueError(_STALE_STATE)
        return self._values

    def _lookup(self, index: Any, method: str) -> tuple[dict[object, Any], Any]:
        values = self._live()
        if type(index) is not StateIndex:
            raise NotAStateError(
                f"State.{method} takes a filterax.nn.StateIndex, got "
                f"{type(index).__name__}."
            )
        if index.marker not in values:
            raise UnknownIndexError(
                f"State.{method}: this StateIndex is not part of this State. A "
                "State holds the indices of the model it was made from "
                "(`State(model)` or `make_with_state`); a model whose indices "
                "were made separately needs its own State."
            )
        return values, index.marker

    def get(self, item: StateIndex[_Value]) -> _Value:
        """The current value of the index `item`.

        **Arguments:**

        - `item`: a [`StateIndex`][filterax.nn.StateIndex] of the model this
          state belongs to (Equinox's name for the parameter).

        **Returns:** its value (an array or pytree of arrays).

        **Raises:** `TypeError` when `item` is not a `StateIndex`;
        `ValueError` when it is not part of this state, or this state was
        superseded by `set`/`update`.

        ```python
        >>> import jax.numpy as jnp
        >>> import filterax as fx
        >>> index = fx.nn.StateIndex(jnp.zeros(2))
        >>> fx.nn.State(index).get(index).tolist()
        [0.0, 0.0]

        ```
        """
        values, marker = self._lookup(item, "get")
        return values[marker]

    def set(self, item: StateIndex[_Value], value: _Value) -> State:
        """A new state in which the index `item` holds `value`.

        This state is marked as used and can no longer be read.

        **Arguments:**

        - `item`: a [`StateIndex`][filterax.nn.StateIndex] of this state.
        - `value`: the new value; it must have the structure, shapes and
          dtypes of the current one.

        **Returns:** the new `State`.

        **Raises:** `ValueError` when `value` differs in structure, shape or
        dtype from the current value (the message shows both), or as for
        [`get`][filterax.nn.State.get].

        ```python
        >>> import jax.numpy as jnp
        >>> import filterax as fx
        >>> index = fx.nn.StateIndex(jnp.zeros(2))
        >>> state = fx.nn.State(index)
        >>> state.set(index, jnp.ones(2)).get(index).tolist()
        [1.0, 1.0]
        >>> state.get(index)
        Traceback (most recent call last):
        ...
        ValueError: This State was superseded: ...
        >>> fx.nn.State(index).set(index, jnp.ones(3))
        Traceback (most recent call last):
        ...
        ValueError: State.set: the new value has another structure, shape or dtype than the current one: the current value is f32[2], the new one is f32[3].

        ```
        """
        values, marker = self._lookup(item, "set")
        old = values[marker]
        value = jtu.tree_map(jnp.asarray, value)
        old_leaves, old_structure = jtu.tree_flatten(old)
        new_leaves, new_structure = jtu.tree_flatten(value)
        same = same_structure(old_structure, new_structure) and all(
            a.shape == b.shape and a.dtype == b.dtype
            for a, b in zip(old_leaves, new_leaves)
        )
        if not same:
            raise ValueError(
                "State.set: the new value has another structure, shape or dtype "
                "than the current one: the current value is "
                f"{tree_pformat(old)}, the new one is {tree_pformat(value)}."
            )
        new_values = dict(values)
        new_values[marker] = value
        self._values = None
        return State._from_values(new_values)

    def substate(self, pytree: Any) -> State:
        """The part of this state that belongs to the indices in `pytree`.

        Useful to map part of a model: pass the substate through
        [`filter_vmap`][filterax.filter_vmap] with that part, then merge the
        result back with [`update`][filterax.nn.State.update]. This state
        stays usable.

        **Arguments:**

        - `pytree`: a pytree containing some of this state's indices (a
          sub-model).

        **Returns:** a new `State` holding just those indices' values.

        **Raises:** `ValueError` when an index in `pytree` is not part of this
        state, or this state was superseded.

        ```python
        >>> import jax.numpy as jnp
        >>> import filterax as fx
        >>> a, b = fx.nn.StateIndex(jnp.zeros(2)), fx.nn.StateIndex(jnp.ones(3))
        >>> state = fx.nn.State((a, b))
        >>> sub = state.substate(b)
        >>> sub.get(b).shape
        (3,)
        >>> state.update(sub.set(b, jnp.full(3, 2.0))).get(b).tolist()
        [2.0, 2.0, 2.0]

        ```
        """
        values = self._live()
        chosen: dict[object, Any] = {}
        for leaf in jtu.tree_leaves(pytree, is_leaf=_is_index):
            if _is_index(leaf):
                _, marker = self._lookup(leaf, "substate")
                chosen[marker] = values[marker]
        return State._from_values(chosen)

    def update(self, substate: State) -> State:
        """A new state with the values of `substate` written over this one's.

        This state is marked as used and can no longer be read.

        **Arguments:**

        - `substate`: a `State` whose indices are all part of this state (from
          [`substate`][filterax.nn.State.substate], after any `set`).

        **Returns:** the new `State`.

        **Raises:** `TypeError` when `substate` is not a `State`; `ValueError`
        when it holds an index this state has not, or either state was
        superseded.

        ```python
        >>> import jax.numpy as jnp
        >>> import filterax as fx
        >>> index = fx.nn.StateIndex(jnp.zeros(()))
        >>> state = fx.nn.State(index)
        >>> sub = state.substate(index).set(index, jnp.ones(()))
        >>> float(state.update(sub).get(index))
        1.0

        ```
        """
        values = self._live()
        if type(substate) is not State:
            raise NotAStateError(
                f"State.update takes a State, got {type(substate).__name__}."
            )
        new_values = dict(values)
        for marker, value in substate._live().items():
            if marker not in values:
                raise ValueError(
                    "State.update(substate): `substate` holds an index this state "
                    "has not; it must come from this state's `substate` method."
                )
            new_values[marker] = value
        self._values = None
        return State._from_values(new_values)

    def _named_values(self) -> Iterator[tuple[object, str, Any]]:
        for position, (marker, value) in enumerate(self._live().items()):
            yield marker, _describe(marker, position), value

    def __repr__(self) -> str:
        if self._values is None:
            return "State(<superseded>)"
        entries = ", ".join(
            f"{name}={tree_pformat(value)}" for _, name, value in self._named_values()
        )
        return f"State({entries})"


def _flatten(state: State) -> tuple[tuple[Any, ...], tuple[object, ...]]:
    values = state._live()
    return tuple(values.values()), tuple(values)


def _flatten_with_keys(
    state: State,
) -> tuple[tuple[tuple[Any, Any], ...], tuple[object, ...]]:
    values = state._live()
    # Unnamed markers are `object()`s: their position, not their identity, is
    # what stays the same from one process to the next.
    children = tuple(
        (jtu.DictKey(marker if isinstance(marker, str) else position), value)
        for position, (marker, value) in enumerate(values.items())
    )
    return children, tuple(values)


def _unflatten(markers: tuple[object, ...], children: Any) -> State:
    return State._from_values(dict(zip(markers, children)))


jtu.register_pytree_with_keys(State, _flatten_with_keys, _unflatten, _flatten)
# `logical_axes` gives a State's values the names declared for their index.
register_state_types(StateIndex, State)
# Running statistics keep their dtype under `mixed_precision`.
register_buffer_type(State)


def _without_init(node: Any) -> Any:
    if _is_index(node):
        return tree_at(lambda index: index.init, node, _DELETED)
    return node


def delete_init_state(model: _T) -> _T:
    """A copy of `model` whose [`StateIndex`][filterax.nn.StateIndex]es no
    longer hold their initial values.

    Once the initial values are in a `State`, keeping them in the model too
    would store them twice (in memory and in checkpoints).
    [`make_with_state`][filterax.nn.make_with_state] calls this for you.

    **Arguments:**

    - `model`: any pytree.

    **Returns:** the copy; `State(copy)` then raises an error.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> model = [fx.nn.StateIndex(jnp.zeros(3)), jnp.ones(2)]
    >>> len(jax.tree.leaves(model)), len(jax.tree.leaves(fx.nn.delete_init_state(model)))
    (2, 1)

    ```
    """
    return jtu.tree_map(_without_init, model, is_leaf=_is_index)


def make_with_state(make_model: Callable[_P, _T]) -> Callable[_P, tuple[_T, State]]:
    """Wraps a model constructor so that it returns the model and its `State`.

    Each [`StateIndex`][filterax.nn.StateIndex] is named after its key path in
    the model (`"BatchNorm.ema_state_index"`), so that two calls make models
    and states with the same structure (one model works with the other's
    state, under `jax.jit` too); the initial values are moved into the state
    (see [`delete_init_state`][filterax.nn.delete_init_state]).

    **Arguments:**

    - `make_model`: a callable returning a model, usually a Module class.

    **Returns:** a callable taking `make_model`'s arguments and returning
    `(model, state)`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> bn, state = fx.nn.make_with_state(fx.nn.BatchNorm)(2, "batch", mode="batch")
    >>> x = jnp.array([[1.0, 2.0], [3.0, 6.0]])
    >>> batched = jax.vmap(bn, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
    >>> out, state = batched(x, state)
    >>> bool(jnp.allclose(out, jnp.array([[-1.0, -1.0], [1.0, 1.0]]), atol=1e-4))
    True
    >>> mean, var = state.get(bn.batch_state_index)
    >>> bool(jnp.allclose(mean, 0.01 * jnp.array([2.0, 4.0])))
    True

    ```
    """

    def make_with_state_impl(*args: _P.args, **kwargs: _P.kwargs) -> tuple[_T, State]:
        model = make_model(*args, **kwargs)
        prefix = type(model).__name__
        paths_and_leaves, treedef = jtu.tree_flatten_with_path(model, is_leaf=_is_index)
        leaves = [
            _renamed(leaf, prefix + jtu.keystr(path)) if _is_index(leaf) else leaf
            for path, leaf in paths_and_leaves
        ]
        model = jtu.tree_unflatten(treedef, leaves)
        return delete_init_state(model), State(model)

    return make_with_state_impl
