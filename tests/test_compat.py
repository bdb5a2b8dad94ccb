"""Fails loudly when a JAX internal that `filterax._compat` relies on changes."""

import os
import traceback
import warnings

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
from jax._src import traceback_util, tree_util as jax_tree_util

import filterax
from filterax import _compat


def test_jax_still_has_every_registry_we_register_into():
    registries = jax_tree_util._all_registries
    assert jtu.default_registry in registries
    assert len(registries) >= 3
    for registry in registries:
        assert hasattr(registry, "register_dataclass_node")


def test_dataclass_node_unflattens_by_calling_the_type_with_keywords():
    # Module relies on this: unflatten is `cls(**{meta fields, data fields})`.
    calls = []

    class Node:
        def __init__(self, **kwargs):
            calls.append(kwargs)
            self.__dict__.update(kwargs)

    _compat.register_dataclass_node(Node, ["data"], ["meta"])
    node = Node(data=1, meta="m")
    leaves, treedef = jtu.tree_flatten(node)
    assert leaves == [1]
    rebuilt = jtu.tree_unflatten(treedef, [2])
    assert calls[-1] == {"meta": "m", "data": 2}
    assert rebuilt.data == 2
    assert jtu.tree_leaves_with_path(node)[0][0] == (jtu.GetAttrKey("data"),)


def test_registered_node_flattens_for_jit_dispatch():
    class Pair:
        def __init__(self, **kwargs):
            self.__dict__.update(kwargs)

    _compat.register_dataclass_node(Pair, ["a", "b"], [])
    out = jax.jit(lambda p: p.a + p.b)(Pair(a=1.0, b=2.0))
    assert out == 3.0


def _dataclass_nodes(*names: str) -> list[type]:
    classes = []
    for name in names:
        cls = type(name, (), {"__init__": lambda self, **kw: self.__dict__.update(kw)})
        _compat.register_dataclass_node(cls, ["w"], [])
        classes.append(cls)
    return classes


def test_same_structure_tells_dataclass_node_classes_apart_at_any_depth():
    # JAX's own `==` on treedefs ignores the class of a dataclass node; the
    # workaround relies on the treedef hash covering it.
    A, B = _dataclass_nodes("A", "B")
    trees = [
        (A(w=1), B(w=1)),
        ((A(w=1), 2), (B(w=1), 2)),
        ({"x": [A(w=1)]}, {"x": [B(w=1)]}),
        (A(w=B(w=1)), A(w=A(w=1))),
    ]
    for a, b in trees:
        assert not _compat.same_structure(jtu.tree_structure(a), jtu.tree_structure(b))
        assert _compat.same_structure(jtu.tree_structure(a), jtu.tree_structure(a))
    assert _compat.same_structure(
        jtu.tree_structure(A(w=B(w=1))), jtu.tree_structure(A(w=B(w=2.0)))
    )
    assert not _compat.same_structure(jtu.tree_structure([1]), jtu.tree_structure((1,)))


def test_jaxpr_dependency_analysis_sees_constant_outputs():
    import jax.numpy as jnp

    closed = jax.make_jaxpr(lambda t: (t * 2, jnp.zeros(3), 3.0, t.sum()))(jnp.ones(3))
    assert _compat.outputs_depending_on_inputs(closed) == [True, False, False, True]


def test_jaxpr_dependency_analysis_follows_chains_and_closed_over_values():
    import jax.numpy as jnp

    outer = jnp.ones(2)

    def f(t):
        u = jnp.sin(t)
        return jnp.cos(u) + outer, outer * 2

    closed = jax.make_jaxpr(f)(jnp.ones(2))
    assert _compat.outputs_depending_on_inputs(closed) == [True, False]


def test_jax_still_words_its_unusable_donation_warning_as_we_filter_it():
    donating = jax.jit(lambda x: x.sum(), donate_argnums=0)
    with pytest.warns(UserWarning, match=_compat.DONATION_WARNING):
        donating(jnp.ones(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with _compat.donation_warning_ignored():
            jax.jit(lambda x: x.sum() + 1, donate_argnums=0)(jnp.ones(3))


def test_an_identity_primitive_gets_every_rule_jax_asks_for():
    # `announce_transform`'s primitive: each interpretation and transform
    # reaches the hooks, and values and derivatives are the identity's.
    seen = []

    def on_interpret(how, params):
        seen.append((params["stack"], how))

    def on_transform(which, params):
        return {**params, "stack": (*params["stack"], which)}

    primitive = _compat.define_identity_primitive(
        "filterax_test_identity", on_interpret=on_interpret, on_transform=on_transform
    )

    def f(x):
        (y,) = primitive.bind(x, stack=())
        return jnp.sin(y).sum()

    x = jnp.arange(3.0)
    np.testing.assert_allclose(
        jax.jit(jax.vmap(jax.grad(f)))(x[None]), jnp.cos(x)[None]
    )
    assert (("jvp_t", "transpose", "vmap"), "mlir") in seen
    assert (("jvp_p", "vmap"), "abstract") in seen


def test_filterax_frames_are_registered_with_jax_traceback_filtering():
    # `_compat` registers the package folder once; JAX's filter and its debugger
    # then hide filterax's frames as they hide JAX's.
    folder = _compat.FILTERAX_DIRECTORY
    assert folder == os.path.dirname(os.path.abspath(filterax.__file__))
    assert folder in traceback_util._exclude_paths
    assert not _compat.shown_in_tracebacks(os.path.join(folder, "_jit", "_api.py"))
    assert not _compat.shown_in_tracebacks(traceback_util.__file__)
    assert _compat.shown_in_tracebacks(__file__)


def test_traceback_boundary_filters_the_frames_below_it():
    def inner() -> None:
        raise KeyError("user")

    @_compat.traceback_boundary
    def entry() -> None:
        inner()

    with pytest.raises(KeyError) as caught:
        entry()
    names = [frame.name for frame in traceback.extract_tb(caught.value.__traceback__)]
    # `inner` is this test file's, so kept; JAX's re-raising wrapper is hidden.
    assert "inner" in names and "reraise_with_filtered_traceback" not in names
    assert entry.__name__ == "entry" and entry.__wrapped__ is not None


def test_the_jaxpr_types_are_those_jax_extend_core_names():
    # Read from `jax._src.core` so that `import filterax` does not import
    # `jax.extend` (which imports Pallas); they must stay the public objects.
    import jax.extend.core

    for name in ("ClosedJaxpr", "Jaxpr", "Var", "jaxpr_as_fun", "jaxprs_in_params"):
        assert getattr(_compat, name) is getattr(jax.extend.core, name), name


def test_sharding_type_error_is_what_jax_raises_for_an_unresolvable_gather():
    # `row_of` falls back to its batched lookup on exactly this error: a row
    # per index gathered under `vmap` from indices split over `Explicit` axes.
    explicit = (jax.sharding.AxisType.Explicit,)
    mesh = jax.make_mesh(
        (2,), ("data",), axis_types=explicit, devices=jax.devices()[:2]
    )
    with jax.set_mesh(mesh):
        table = jnp.ones((4, 2))
        index = jax.device_put(jnp.arange(4) % 4, jax.sharding.PartitionSpec("data"))
        with pytest.raises(_compat.ShardingTypeError):
            jax.jit(jax.vmap(lambda i: table[i]))(index)


def test_import_filterax_imports_no_jax_extend() -> None:
    # `jax.extend` imports Pallas: most of what `import filterax` would add to
    # `import jax` (`benchmarks/bench_import.py`). Its jaxpr types come through
    # `_compat` instead.
    import subprocess
    import sys

    code = "import sys, filterax; print('jax.extend' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
