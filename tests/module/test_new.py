"""A Module class's own `__new__` may assign fields before `__init__` runs, as
in Equinox (a normalizing-flow library does so); the instance is frozen once
`__init__` returns, and classes without a `__new__` are unchanged (issue 39)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import filterax as fx
from filterax._module import _construction


def _no_marks_left() -> bool:
    return not _construction._MADE_IN_NEW and not _construction._INITIALISING


class Flow(fx.Module):
    """The library's shape: `__new__` sets a field, `__init__` the others."""

    dim: int
    weight: jax.Array

    def __new__(cls, *args: Any, **kwargs: Any) -> Flow:
        instance = super().__new__(cls, *args, **kwargs)
        setattr(instance, "dim", 3)  # noqa: B010 - the library's spelling
        return instance

    def __init__(self, scale: float):
        self.weight = scale * jnp.ones(self.dim)


def test_fields_assigned_in_new_are_kept_and_read_by_init():
    flow = Flow(2.0)
    assert flow.dim == 3
    assert flow.weight.tolist() == [2.0, 2.0, 2.0]
    assert _no_marks_left()


def test_the_instance_is_frozen_once_init_returns():
    flow = Flow(2.0)
    with pytest.raises(dataclasses.FrozenInstanceError, match="immutable"):
        flow.dim = 4  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(flow, "dim", 4)  # noqa: B010


def test_object_setattr_in_new_works_too():
    class Scaled(fx.Module):
        scale: float

        def __new__(cls, scale: float) -> Scaled:
            instance = super().__new__(cls)
            object.__setattr__(instance, "scale", 2 * scale)
            return instance

        def __init__(self, scale: float):
            pass

    assert Scaled(1.5).scale == 3.0


def test_assigning_a_name_that_is_no_field_in_new_is_refused():
    class Sloppy(fx.Module):
        x: int

        def __new__(cls) -> Sloppy:
            instance = super().__new__(cls)
            instance.y = 1  # type: ignore[attr-defined]
            return instance

        def __init__(self):
            self.x = 1

    with pytest.raises(dataclasses.FrozenInstanceError, match="no field 'y'"):
        Sloppy()
    assert _no_marks_left()


def test_a_subclass_new_calling_its_parents_can_assign_after_it():
    class Shifted(Flow):
        shift: int

        def __new__(cls, *args: Any, **kwargs: Any) -> Shifted:
            instance = super().__new__(cls, *args, **kwargs)
            instance.shift = instance.dim + 1
            instance.dim = 10
            return instance

        def __init__(self, scale: float):
            self.weight = scale * jnp.ones(self.dim)

    shifted = Shifted(1.0)
    assert (shifted.dim, shifted.shift, shifted.weight.shape) == (10, 4, (10,))
    assert _no_marks_left()


def test_converters_and_checks_run_on_values_set_in_new():
    class Checked(fx.Module):
        count: int = fx.field(converter=int)

        def __new__(cls) -> Checked:
            instance = super().__new__(cls)
            instance.count = 5.0  # type: ignore[assignment]
            return instance

        def __init__(self):
            pass

        def __check_init__(self) -> None:
            if self.count < 0:
                raise ValueError("negative")

    checked = Checked()
    assert checked.count == 5 and type(checked.count) is int


def test_an_init_called_with_wrong_arguments_leaves_nothing_assignable():
    with pytest.raises(TypeError):
        Flow()  # type: ignore[call-arg]
    assert _no_marks_left()


def test_a_generated_init_overrides_what_new_set():
    class Plain(fx.Module):
        x: int

        def __new__(cls, *args: Any, **kwargs: Any) -> Plain:
            instance = super().__new__(cls)
            instance.x = 5
            return instance

    assert Plain(7).x == 7
    assert jax.tree_util.tree_map(lambda x: x + 1, Plain(7)).x == 8  # unflattened
    with pytest.raises(TypeError, match="x"):
        Plain()  # type: ignore[call-arg]
    assert _no_marks_left()


def test_a_failing_new_leaves_nothing_assignable():
    class Failing(fx.Module):
        x: int

        def __new__(cls, x: int) -> Failing:
            instance = super().__new__(cls)
            instance.x = x
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        Failing(1)
    assert _no_marks_left()


def test_a_module_built_inside_new_is_finished_and_frozen_on_its_own():
    class Inner(fx.Module):
        value: int

        def __new__(cls, value: int) -> Inner:
            instance = super().__new__(cls)
            instance.value = value
            return instance

        def __init__(self, value: int):
            pass

    class Outer(fx.Module):
        inner: Inner

        def __new__(cls) -> Outer:
            instance = super().__new__(cls)
            instance.inner = Inner(4)
            with pytest.raises(dataclasses.FrozenInstanceError):
                instance.inner.value = 5
            return instance

        def __init__(self):
            pass

    assert Outer().inner.value == 4
    assert _no_marks_left()


def test_jax_unflatten_and_transforms_do_not_call_the_users_new():
    calls = []

    class Counted(fx.Module):
        weight: jax.Array
        size: int = fx.field(static=True)

        def __new__(cls, size: int) -> Counted:
            calls.append(size)
            instance = super().__new__(cls)
            instance.size = size
            return instance

        def __init__(self, size: int):
            self.weight = jnp.ones(size)

    model = Counted(2)
    leaves, treedef = jax.tree_util.tree_flatten(model)
    rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
    assert rebuilt.size == 2 and rebuilt.weight.tolist() == [1.0, 1.0]
    grads = fx.filter_grad(lambda m: m.weight.sum())(model)
    assert grads.weight.tolist() == [1.0, 1.0]
    copied = copy.deepcopy(model)  # through `__reduce__`, as pickle
    assert copied.size == 2
    assert calls == [2]
    assert _no_marks_left()


def test_classes_without_new_get_no_extra_base():
    class Plain(fx.Module):
        x: int

    assert Plain.__mro__ == (Plain, fx.Module, object)
    assert _construction.FieldsSetInNew in Flow.__mro__
    assert Plain.__dict__["__filterax_plan__"].plain
    assert not Flow.__dict__["__filterax_plan__"].plain
