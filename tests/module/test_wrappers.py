"""One wrapper mechanism for every filtered transform: `FunctionWrapper`, the one
bound-method type `BoundMethod` (with `.lower` where the transform has one), and
the one list of attributes copied from the wrapped function."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import filterax as fx
from filterax._module import FunctionWrapper
from filterax._module._attributes import COPIED_ATTRIBUTES


def _mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((1,), ("data",))


def _shard_map(fun: Callable[..., Any]) -> Any:
    return fx.filter_shard_map(
        fun, mesh=_mesh(), in_specs=PartitionSpec(), out_specs=PartitionSpec()
    )


def _sharded_jit(fun: Callable[..., Any]) -> Any:
    return fx.filter_jit(fun, in_shardings=NamedSharding(_mesh(), PartitionSpec()))


# name -> (transform, whether the wrapper shows the function's annotations)
TRANSFORMS: dict[str, tuple[Callable[[Callable[..., Any]], Any], bool]] = {
    "filter_jit": (fx.filter_jit, True),
    **{
        f"filter_jit(donate={mode!r})": (
            lambda fun, mode=mode: fx.filter_jit(fun, donate=mode),
            True,
        )
        for mode in ("all", "all-except-first", "warn", "warn-except-first")
    },
    "filter_jit(in_shardings=...)": (_sharded_jit, True),
    "filter_grad": (fx.filter_grad, True),
    "filter_value_and_grad": (fx.filter_value_and_grad, True),
    "filter_jacfwd": (fx.filter_jacfwd, True),
    "filter_checkpoint": (fx.filter_checkpoint, True),
    "filter_vmap": (fx.filter_vmap, False),
    "filter_pmap": (fx.filter_pmap, False),
    "filter_shard_map": (_shard_map, False),
}


def documented(x: jax.Array, scale: float = 2.0) -> jax.Array:
    """Scales x."""
    return (x * scale).sum()


@pytest.mark.parametrize("name", TRANSFORMS)
def test_every_transform_returns_a_function_wrapper(name: str) -> None:
    transform, keeps_annotations = TRANSFORMS[name]
    wrapper = transform(documented)
    assert isinstance(wrapper, FunctionWrapper)
    for attribute in COPIED_ATTRIBUTES:
        assert getattr(wrapper, attribute) == getattr(documented, attribute)
    assert wrapper.__wrapped__ is documented
    if keeps_annotations:
        assert wrapper.__annotations__ == documented.__annotations__
    else:
        assert "__annotations__" not in vars(wrapper)
    # A pytree whose one child is the function; its repr names the transform.
    leaves, treedef = jax.tree.flatten(wrapper, is_leaf=lambda x: x is documented)
    assert leaves == [documented]
    rebuilt = jax.tree.unflatten(treedef, leaves)
    assert type(rebuilt) is type(wrapper) and rebuilt == wrapper
    assert hash(rebuilt) == hash(wrapper)
    transform_name = name.split("(")[0]
    assert repr(wrapper) == f"<{transform_name} of documented>"


def test_two_filter_jit_wrappers_of_one_function_are_equal() -> None:
    assert fx.filter_jit(documented) == fx.filter_jit(documented)
    assert fx.filter_jit(documented) != fx.filter_jit(documented, donate="all")


def _assert_close(a: Any, b: Any) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    jax.tree.map(np.testing.assert_allclose, a, b)


class Scaled(fx.Module):
    weight: jax.Array

    def plain(self, x: jax.Array) -> jax.Array:
        return self.weight * x

    @fx.filter_jit
    def jitted(self, x: jax.Array) -> jax.Array:
        """Jitted."""
        return self.weight * x

    @fx.filter_pmap
    def pmapped(self, x: jax.Array) -> jax.Array:
        return self.weight * x

    @fx.filter_vmap(in_axes=(None, 0))
    def vmapped(self, x: jax.Array) -> jax.Array:
        return self.weight * x

    @fx.filter_grad
    def grad_of_x(self, x: jax.Array) -> jax.Array:
        return (self.weight * x).sum()


@pytest.mark.parametrize(
    "method", ["plain", "jitted", "pmapped", "vmapped", "grad_of_x"]
)
def test_methods_of_every_transform_bind_into_the_one_bound_method_type(
    method: str,
) -> None:
    model = Scaled(jnp.ones((1, 3)))
    bound = getattr(model, method)
    assert type(bound) is fx.BoundMethod
    assert bound.__self__ is model
    assert jax.tree.leaves(bound) == [model.weight]
    assert bound.__name__ == method
    x = jnp.arange(3.0).reshape(1, 3)
    _assert_close(bound(x), getattr(Scaled, method)(model, x))
    # Rebuilt by JAX with new arrays: still bound, to the new model.
    doubled = jax.tree.map(lambda leaf: 2 * leaf, bound)
    assert type(doubled) is fx.BoundMethod
    assert doubled.__func__ is bound.__func__
    np.testing.assert_allclose(doubled.__self__.weight, 2 * model.weight)
    _assert_close(doubled(x), getattr(Scaled, method)(doubled.__self__, x))
    assert bound == getattr(model, method)


@pytest.mark.parametrize(("method", "has_lower"), [
    ("plain", False), ("vmapped", False), ("grad_of_x", False),
    ("jitted", True), ("pmapped", True),
])  # fmt: skip
def test_bound_methods_lower_where_the_transform_does(
    method: str, has_lower: bool
) -> None:
    model = Scaled(jnp.ones((1, 3)))
    bound = getattr(model, method)
    assert hasattr(bound, "lower") is has_lower
    if not has_lower:
        with pytest.raises(AttributeError, match="lower"):
            bound.lower  # noqa: B018
        return
    x = jnp.arange(3.0).reshape(1, 3)
    compiled = bound.lower(x).compile()
    # Called without the instance, as the method is.
    np.testing.assert_allclose(compiled(x + 1), bound(x + 1))


def test_a_bound_wrapper_pickles_and_compares_like_a_bound_method() -> None:
    model = Scaled(jnp.ones(3))
    bound = model.jitted
    restored = pickle.loads(pickle.dumps(model.plain))
    assert type(restored) is fx.BoundMethod and restored.__self__ == model
    assert bound == Scaled(jnp.ones(3)).jitted
    assert bound != Scaled(jnp.zeros(3)).jitted
    assert bound != model.plain


def test_bound_method_fields_given_by_position_or_keyword() -> None:
    model = Scaled(jnp.ones(3))
    by_keyword = fx.BoundMethod(__func__=Scaled.plain, __self__=model)
    by_position = fx.BoundMethod(Scaled.plain, model)
    assert by_keyword == by_position
    np.testing.assert_allclose(by_keyword(2.0), 2.0 * model.weight)
    with pytest.raises(TypeError, match="__self__"):
        fx.BoundMethod(Scaled.plain)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="callable"):
        fx.BoundMethod(3, model)
