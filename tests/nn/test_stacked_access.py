"""`nn.Stacked`'s errors for what its layers hold and for slices that select
no layer: never an empty stack that returns its input."""

from __future__ import annotations

import jax
import pytest

import filterax as fx

KEY = jax.random.key(0)


def _stack(num: int = 4) -> fx.nn.Stacked:
    return fx.nn.Stacked(lambda k: fx.nn.Linear(4, 4, key=k), num, key=KEY)


def test_a_layer_attribute_points_at_layers():
    stacked = _stack()
    with pytest.raises(
        AttributeError, match=r"stacked\.layers\.weight.*length 4"
    ) as caught:
        stacked.weight  # noqa: B018
    assert "stacked[0].weight" in str(caught.value)
    with pytest.raises(AttributeError, match=r"stacked\.layers\.in_features`\)"):
        stacked.in_features  # noqa: B018
    assert stacked.layers.weight.shape == (4, 4, 4)


def test_an_unknown_attribute_lists_the_fields():
    with pytest.raises(AttributeError, match=r"'nothing'.*layers, num, remat, unroll"):
        _stack().nothing  # noqa: B018
    assert not hasattr(_stack(), "nothing")


@pytest.mark.parametrize("index", [slice(5, 9), slice(3, 1), slice(4, None)])
def test_a_slice_selecting_no_layer_is_refused(index):
    with pytest.raises(IndexError, match="selects no layer of a stack of 4"):
        _stack()[index]


def test_slices_follow_python_lists_otherwise():
    stacked = _stack()
    assert len(stacked[2:9]) == 2
    assert len(stacked[::-1]) == 4
    assert fx.tree_equal(stacked[::-1][0], stacked[3])
