"""Warnings filterax gives, all subclasses of `FilteraxWarning`:
`FilteraxDeprecationWarning`, for names and arguments kept for code written
against Equinox; `NoDifferentiableLeafWarning`, for a differentiation whose
argument has nothing to differentiate; `ClassVarFieldWarning`, for an
`AbstractClassVar` resolved by an instance field. And `warn_at_caller`, which
attributes a warning to the user's code even when filterax's generated code (a
Module's `__init__`) stands between."""

from __future__ import annotations

import sys
import warnings

__all__ = [
    "GENERATED_FILENAME",
    "ClassVarFieldWarning",
    "FilteraxDeprecationWarning",
    "FilteraxWarning",
    "NoDifferentiableLeafWarning",
    "warn_at_caller",
    "warn_deprecated",
]

# The file name of the code filterax generates (compiled with it), which
# `warn_at_caller` steps over.
GENERATED_FILENAME = "<filterax generated>"


class FilteraxWarning(UserWarning):
    """The base class of every warning filterax gives, so that one filter
    silences them all or turns them all into errors.

    A `UserWarning`, the category Equinox gives its warnings, so filters and
    `pytest.warns(UserWarning)` written for Equinox code still match.

    **Arguments:**

    - `*args`: as for any warning; the first is the message.

    **Returns:** the warning.

    ```python
    >>> import warnings
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("error", fx.FilteraxWarning)
    ...     try:
    ...         fx.filter_grad(lambda x: (x * 1.0).sum())(jnp.arange(3))  # ints
    ...     except fx.FilteraxWarning as warning:
    ...         print(type(warning).__name__)
    NoDifferentiableLeafWarning

    ```
    """


FilteraxWarning.__module__ = "filterax"


class FilteraxDeprecationWarning(FutureWarning, FilteraxWarning):
    """Warns that a name or argument kept for code written against Equinox
    (`static_field`, `LayerNorm(elementwise_affine=...)`,
    `deterministic=`, `filter_custom_vjp.defvjp`) is deprecated, and names
    what replaces it.

    A `FutureWarning`, so Python shows it by default, and a `UserWarning`, the
    category Equinox gives these warnings, so filters and `pytest.warns`
    written for Equinox code match it.

    **Arguments:**

    - `*args`: as for any warning; the first is the message.

    **Returns:** the warning.

    ```python
    >>> import warnings
    >>> import filterax as fx
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("error", UserWarning)  # as for Equinox code
    ...     try:
    ...         fx.nn.LayerNorm(3, elementwise_affine=False)
    ...     except fx.FilteraxDeprecationWarning as warning:
    ...         print(isinstance(warning, FutureWarning), "use_weight" in str(warning))
    True True

    ```
    """


FilteraxDeprecationWarning.__module__ = "filterax"


class NoDifferentiableLeafWarning(FilteraxWarning):
    """Warns that [`filter_grad`][filterax.filter_grad],
    [`filter_value_and_grad`][filterax.filter_value_and_grad] or
    [`filter_vjp`][filterax.filter_vjp] was given an argument to differentiate
    that holds no differentiable leaf (no floating-point or complex array
    outside a [`NonDifferentiable`][filterax.NonDifferentiable]), so every
    gradient is `None` (or zero). Usually the arguments are in the wrong order
    (the data first, the model second) or the parameters are integer arrays.

    Shown once per call site, as Python shows warnings. A
    [`FilteraxWarning`][filterax.FilteraxWarning]; where
    differentiating such an argument is meant, silence it with
    `warnings.filterwarnings("ignore", category=fx.NoDifferentiableLeafWarning)`.

    **Arguments:**

    - `*args`: as for any warning; the first is the message.

    **Returns:** the warning.

    ```python
    >>> import warnings
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> def loss(model, x):
    ...     return (model * x).sum()
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     grads = fx.filter_grad(loss)(jnp.arange(3), jnp.ones(3))  # int "model"
    >>> grads is None, caught[0].category is fx.NoDifferentiableLeafWarning
    (True, True)

    ```
    """


NoDifferentiableLeafWarning.__module__ = "filterax"


class ClassVarFieldWarning(FilteraxWarning):
    """Warns that a Module class resolves an inherited
    [`AbstractClassVar`][filterax.AbstractClassVar] with an instance field
    (`name: str`) instead of a class attribute (`name: ClassVar[str] = ...`).

    An `AbstractClassVar` promises that `cls.name` can be read on every
    concrete subclass; an instance field gives each instance its own value
    and the class none, so that promise is broken. The class is still
    accepted, as Equinox accepts it, so that code written against Equinox
    keeps working. Given once, when the class is created.

    **Arguments:**

    - `*args`: as for any warning; the first is the message.

    **Returns:** the warning.

    ```python
    >>> import warnings
    >>> import filterax as fx
    >>> class Activation(fx.Module):
    ...     name: fx.AbstractClassVar[str]
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     class Named(Activation):
    ...         name: str  # an instance field: `Named.name` does not exist
    >>> caught[0].category.__name__, Named("relu").name
    ('ClassVarFieldWarning', 'relu')

    ```
    """


ClassVarFieldWarning.__module__ = "filterax"


def warn_at_caller(message: str, category: type[Warning], stacklevel: int) -> None:
    """`warnings.warn(message, category, stacklevel)` as if called by the
    caller of this function, except that frames of filterax's generated code
    (between a layer's `__init__` and the user's call) are not counted."""
    target = stacklevel  # the frame `warnings.warn` would name, seen from here
    try:
        frame = sys._getframe(target)
    except ValueError:  # a shallower stack: `warnings.warn` copes
        frame = None
    while frame is not None and frame.f_code.co_filename == GENERATED_FILENAME:
        frame, target = frame.f_back, target + 1
    warnings.warn(message, category, stacklevel=target + 1)


def warn_deprecated(message: str, stacklevel: int) -> None:
    """Gives a `FilteraxDeprecationWarning`, as `warn_at_caller` does."""
    warn_at_caller(message, FilteraxDeprecationWarning, stacklevel + 1)
