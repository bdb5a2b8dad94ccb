"""`breakpoint_if`: JAX's debugger, opened only when a runtime condition holds."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .._errors import any_over_batch, own_frames_on_top

__all__ = ["breakpoint_if"]


def _open_in_this_frame(kwargs: dict[str, Any]) -> Any:
    """Opens the debugger showing only this frame, whose locals `vmap` never
    batches; returns an opaque `True` computed once it is closed."""
    # filterax's frames are excluded from JAX's filtered tracebacks, which the
    # debugger also uses: this one frame must be shown unfiltered.
    return jax.debug.breakpoint(
        token=jnp.asarray(True), **{**kwargs, "filter_frames": False}, num_frames=1
    )


def _after(marker: Any, token: Any) -> Any:
    """`token`, as a value that the compiler sees depending on `marker`."""
    leaves, treedef = jax.tree.flatten(token)
    passed = jax.pure_callback(
        lambda _, *values: values,
        [jax.ShapeDtypeStruct(leaf.shape, leaf.dtype) for leaf in leaves],
        marker,
        *leaves,
        vmap_method="broadcast_all",
    )
    return jax.tree.unflatten(treedef, passed)


def breakpoint_if(pred: Any, **kwargs: Any) -> Any:
    """Opens JAX's debugger (`jax.debug.breakpoint`) only when `pred` is true.

    Works under `jit`, `vmap` (the debugger opens once if any batch element's
    `pred` is true) and differentiation. The debugger opens in your code
    (filterax's frames are hidden, as JAX hides its own). Under `vmap`, JAX cannot show
    frames whose values are batched, so the debugger then shows only a frame of
    filterax's own.

    **Arguments:**

    - `pred`: a bool or boolean array; the debugger opens if any element is true.
    - `**kwargs`: passed to `jax.debug.breakpoint` (`token`, `num_frames`,
      `backend`, ...). `num_frames` counts frames of your code, 1 by default
      (capturing every frame, as JAX's default does, also captures the values
      of code outside the transformation).

    **Returns:** `token` if one was given (use it, or the breakpoint is
    removed with the unused computation), else `None`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> @jax.jit
    ... def f(x):
    ...     return fx.debug.breakpoint_if(x < 0, token=x) + 1
    >>> f(jnp.ones(2))  # x >= 0: no debugger
    Array([2., 2.], dtype=float32)

    ```
    """
    dtype = getattr(pred, "dtype", None)
    if not isinstance(pred, bool) and (
        dtype is None or not jnp.issubdtype(dtype, jnp.bool_)
    ):
        raise TypeError(
            f"breakpoint_if: `pred` must be a bool or a boolean array, got {pred!r}."
        )
    token = kwargs.pop("token", None)
    user_frames = kwargs.pop("num_frames", None)

    def open_debugger(show_frames: bool) -> Any:
        if not show_frames:
            # `token` is an operand of the branch, so it is computed first.
            marker = _open_in_this_frame(kwargs)
            return None if token is None else _after(marker, token)
        # Frames from this one to `breakpoint_if`'s are filterax's.
        num_frames = own_frames_on_top() + (1 if user_frames is None else user_frames)
        return jax.debug.breakpoint(token=token, num_frames=num_frames, **kwargs)

    def run(show_frames: bool) -> Any:
        return lax.cond(
            any_over_batch(jnp.any(jnp.asarray(pred))),
            lambda: open_debugger(show_frames),
            lambda: token,
        )

    try:
        return run(show_frames=True)
    except NotImplementedError:
        # `vmap` could not batch the debugger's capture of batched locals.
        return run(show_frames=False)
