import jax
import pytest

import filterax as fx


def test_pytree_is_an_annotation_that_cannot_be_built():
    with pytest.raises(TypeError, match="annotation"):
        fx.PyTree()


def test_subscripted_pytree_is_usable_in_annotations():
    def leaves(tree: fx.PyTree[jax.Array]) -> int:
        return len(jax.tree.leaves(tree))

    assert fx.PyTree[jax.Array] is fx.PyTree
    assert leaves(([1.0], {"a": 2.0})) == 2
