"""`AbstractClassVar`: resolved by a class attribute, or (as Equinox accepts)
an instance field without a default, with a `ClassVarFieldWarning`; a field
with a default is refused."""

from __future__ import annotations

import warnings
from typing import ClassVar

import pytest

import filterax as fx


class Activation(fx.Module):
    name: fx.AbstractClassVar[str]


def test_a_field_without_default_is_accepted_with_a_warning_at_the_class():
    # Equinox documents only class attributes as resolving it, but accepts (and
    # tests, in its `test_instance_overriding_abstract_class_var`) a field
    # without a default: filterax keeps such programs working, and says that
    # `Child.name`, which an AbstractClassVar promises, does not exist.
    with pytest.warns(fx.ClassVarFieldWarning, match=r"Child\.name.*ClassVar") as got:

        class Child(Activation):
            name: str

    assert got[0].filename == __file__  # the class statement, not filterax
    assert Child("x").name == "x" and Child.__abstractclassvars__ == frozenset()
    assert not hasattr(Child, "name")


def test_the_warning_is_a_filterax_warning_that_one_filter_silences():
    assert issubclass(fx.ClassVarFieldWarning, fx.FilteraxWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=fx.FilteraxWarning)

        class Child(Activation):
            name: str

    assert Child("y").name == "y"


def test_a_subclass_of_the_resolving_class_does_not_warn_again():
    with pytest.warns(fx.ClassVarFieldWarning):

        class Child(Activation):
            name: str

    with warnings.catch_warnings():
        warnings.simplefilter("error")

        class Grandchild(Child):
            other: int

    assert Grandchild("z", 1).name == "z"


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
