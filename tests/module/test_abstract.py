"""`AbstractClassVar`: resolved by a class attribute, or (as Equinox accepts)
an instance field without a default; a field with a default is refused."""

from __future__ import annotations

from typing import ClassVar

import pytest

import filterax as fx


class Activation(fx.Module):
    name: fx.AbstractClassVar[str]


def test_an_abstract_class_var_resolved_by_a_field_without_default_is_accepted():
    # Equinox documents only class attributes as resolving it, but accepts (and
    # tests, in its `test_instance_overriding_abstract_class_var`) a field
    # without a default; filterax keeps Equinox programs working.
    class Child(Activation):
        name: str

    assert Child("x").name == "x" and Child.__abstractclassvars__ == frozenset()


def test_an_abstract_class_var_resolved_by_a_field_with_a_default_is_refused():
    with pytest.raises(TypeError, match="instance field that has a default"):

        class Child(Activation):
            name: str = "child"


def test_an_abstract_class_var_resolved_by_a_class_var_or_class_attribute():
    class ReLU(Activation):
        name: ClassVar[str] = "relu"

    class Tanh(Activation):
        name = "tanh"

    assert ReLU.name == "relu" and ReLU().name == "relu"
    assert Tanh.name == "tanh" and Tanh.__abstractclassvars__ == frozenset()


def test_an_abstract_class_var_left_unresolved_still_refuses_instances():
    class Unresolved(Activation):
        width: int

    with pytest.raises(TypeError, match="AbstractClassVar 'name'"):
        Unresolved(3)


def test_an_abstract_var_may_still_be_resolved_by_a_field_without_default():
    class Layer(fx.Module):
        width: fx.AbstractVar[int]

    class Dense(Layer):
        width: int

    assert Dense(3).width == 3
