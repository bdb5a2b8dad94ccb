"""An error raised in a user's function under a filtered transform shows the
user's frames and JAX's filtered traceback, with no frame from `filterax/`
(JAX's default `jax_traceback_filtering`, which hides JAX's own frames too)."""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import filterax as fx

FILTERAX = os.path.dirname(os.path.abspath(fx.__file__))


class UserError(Exception):
    pass


def _fails(*args: Any) -> Any:
    raise UserError("raised in user code")


def _fails_in_branch(x: Any) -> Any:
    raise UserError("raised in user code")


@pytest.fixture(autouse=True)
def _default_filtering() -> Iterator[None]:
    before = jax.config.jax_traceback_filtering
    jax.config.update("jax_traceback_filtering", "auto")
    yield
    jax.config.update("jax_traceback_filtering", before)


X = jnp.ones(2)


def _custom_jvp() -> Any:
    fails = fx.filter_custom_jvp(_fails)
    fails.def_jvp(lambda primals, tangents: (primals[0], tangents[0]))
    return fails(X)


TRANSFORMS: dict[str, Callable[[], Any]] = {
    "filter_jit": lambda: fx.filter_jit(_fails)(X),
    "filter_jit of a Module": lambda: fx.filter_jit(_fails)(fx.nn.Identity(), X),
    "filter_grad": lambda: fx.filter_grad(_fails)(X),
    "filter_value_and_grad": lambda: fx.filter_value_and_grad(_fails)(X),
    "filter_vjp": lambda: fx.filter_vjp(_fails, X),
    "filter_jvp": lambda: fx.filter_jvp(_fails, (X,), (X,)),
    "filter_jacrev": lambda: fx.filter_jacrev(_fails)(X),
    "filter_checkpoint": lambda: fx.filter_checkpoint(_fails)(X),
    "filter_custom_jvp": _custom_jvp,
    "filter_vmap": lambda: fx.filter_vmap(_fails)(X),
    "filter_pmap": lambda: fx.filter_pmap(_fails)(X[None]),
    "filter_scan": lambda: fx.filter_scan(_fails, X, X),
    "filter_cond": lambda: fx.filter_cond(True, _fails_in_branch, _fails_in_branch, X),
    "filter_while_loop": lambda: fx.filter_while_loop(_fails, _fails, X),
    "filter_fori_loop": lambda: fx.filter_fori_loop(0, 2, _fails, X),
    "filter_eval_shape": lambda: fx.filter_eval_shape(_fails, X),
    "filter_make_jaxpr": lambda: fx.filter_make_jaxpr(_fails)(X),
    "filter_closure_convert": lambda: fx.filter_closure_convert(_fails, X),
    "filter_jit of filter_grad": lambda: fx.filter_jit(fx.filter_grad(_fails))(X),
    "filter_grad of filter_vmap": lambda: fx.filter_grad(
        lambda x: fx.filter_vmap(_fails)(x).sum()
    )(X),
}


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_a_user_error_under_a_transform_shows_no_filterax_frame(name: str) -> None:
    with pytest.raises(UserError) as caught:
        TRANSFORMS[name]()
    frames = traceback.extract_tb(caught.value.__traceback__)
    ours = [f"{f.filename}:{f.lineno} {f.name}" for f in frames]
    assert not [f for f in ours if f.startswith(FILTERAX + os.sep)], ours
    # The user's own lines stay: the raise and the call.
    assert frames[-1].name in ("_fails", "_fails_in_branch")
    assert any(f.filename == __file__ and f.name != frames[-1].name for f in frames)


def test_frames_are_kept_with_filtering_off() -> None:
    jax.config.update("jax_traceback_filtering", "off")
    with pytest.raises(UserError) as caught:
        fx.filter_grad(_fails)(X)
    frames = traceback.extract_tb(caught.value.__traceback__)
    assert any(f.filename.startswith(FILTERAX + os.sep) for f in frames)


PUBLIC_EXCEPTIONS_AND_WARNINGS = sorted(
    name
    for name in dir(fx)
    if not name.startswith("_")
    and isinstance(getattr(fx, name), type)
    and issubclass(getattr(fx, name), BaseException)
)


@pytest.mark.parametrize("name", PUBLIC_EXCEPTIONS_AND_WARNINGS)
def test_public_exception_and_warning_types_print_under_their_public_name(name):
    cls = getattr(fx, name)  # `EquinoxRuntimeError` is `FilteraxRuntimeError`
    assert cls.__module__ == "filterax", f"{name} is {cls.__module__}.{name}"
    assert getattr(fx, cls.__qualname__) is cls
    shown = traceback.format_exception_only(cls("x"))[0]
    assert shown.startswith(f"filterax.{cls.__qualname__}:")
