"""Every sharding handed on to JAX is checked first, and a misfit (rank,
divisibility, mesh axes) is named by its key path: `filter_jit`'s
`in_shardings` and `out_shardings`, `filter_shard`, `sharded_init`, and
`check_shardings_fit` (a restore's template)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import filterax as fx
from filterax._sharding import check_shardings_fit

KEY = jax.random.key(0)


def _rows(mesh: jax.sharding.Mesh) -> NamedSharding:
    return NamedSharding(mesh, P("data"))


@pytest.mark.parametrize(
    "shape, spec, message",
    [
        ((6, 2), P("data"), r"dimension 0 \(size 6\).*4 does not divide 6"),
        ((8,), P("data", "model"), r"2 entries.*shape \(8,\) \(rank 1\)"),
    ],
)
def test_filter_shard_names_the_key_path(mesh, shape, spec, message):
    tree = {"params": {"w": jnp.zeros(shape)}, "name": "x"}
    with pytest.raises(
        ValueError,
        match=r"filter_shard: at pytree\['params'\]\['w'\]: the sharding .*" + message,
    ):
        fx.filter_shard(tree, {"params": NamedSharding(mesh, spec), "name": None})


def test_filter_shard_checks_structs_and_traced_values(mesh):
    struct = jax.ShapeDtypeStruct((6,), jnp.float32)
    with pytest.raises(ValueError, match=r"pytree\[0\]"):
        fx.filter_shard([struct], _rows(mesh))

    @fx.filter_jit
    def constrained(x):
        return fx.filter_shard({"x": x}, _rows(mesh))

    with pytest.raises(ValueError, match=r"pytree\['x'\].*does not divide 6"):
        with jax.set_mesh(mesh):
            constrained(jnp.zeros(6))


def test_filter_shard_with_a_partition_spec_checks_the_mesh_axes(mesh):
    with jax.set_mesh(mesh):
        with pytest.raises(ValueError, match=r"pytree\.w.*mesh axis 'pipe'"):
            fx.filter_shard(_W(jnp.zeros(8)), P("pipe"))
        with pytest.raises(ValueError, match=r"pytree\.w.*same mesh axis 'data'"):
            fx.filter_shard(_W(jnp.zeros((8, 8))), P("data", "data"))


class _W(fx.Module):
    w: jax.Array


def test_filter_jit_in_shardings_names_the_argument(mesh):
    linear = fx.nn.Linear(4, 6, key=KEY)

    @fx.filter_jit(in_shardings=((fx.sharding_of(linear, mesh, {}), _rows(mesh)), None))
    def apply(model, x):
        return jax.vmap(model)(x)

    with pytest.raises(
        ValueError, match=r"in_shardings: at args\[1\].*does not divide 6"
    ):
        with jax.set_mesh(mesh):
            apply(linear, jnp.zeros((6, 4)))


def test_filter_jit_in_shardings_checks_committed_arguments_at_trace(mesh):
    rows = _rows(mesh)
    w = jax.device_put(jnp.zeros((6, 2)), NamedSharding(mesh, P()))

    @fx.filter_jit(in_shardings=(({"w": rows},), None))
    def double(params):
        return params["w"] * 2

    with pytest.raises(ValueError, match=r"in_shardings: at args\[0\]\['w'\]"):
        with jax.set_mesh(mesh):
            double({"w": w})


def test_filter_jit_out_shardings_names_the_output(mesh):
    @fx.filter_jit(out_shardings={"y": NamedSharding(mesh, P(None, "model"))})
    def make(x):
        return {"y": jnp.zeros((4, 3)) + x}

    with pytest.raises(
        ValueError, match=r"out_shardings: at the output\['y'\].*dimension 1"
    ):
        with jax.set_mesh(mesh):
            make(jnp.float32(1))


def test_sharded_init_names_the_key_path(mesh):
    with pytest.raises(ValueError, match=r"tree\.weight.*does not divide 6"):
        fx.sharded_init(fx.nn.Linear, mesh, {"out": "data"})(4, 6, key=KEY)


def test_check_shardings_fit_for_templates(mesh):
    rows = _rows(mesh)
    good = {"w": jax.ShapeDtypeStruct((8, 2), jnp.float32, sharding=rows)}
    check_shardings_fit(good, who="restore")
    bad = [good, {"b": jax.ShapeDtypeStruct((6,), jnp.float32, sharding=rows)}]
    with pytest.raises(
        ValueError, match=r"^restore: at template\[1\]\['b'\]: .*not divide 6"
    ):
        check_shardings_fit(bad, who="restore")
    arrays = {"w": jnp.zeros((8, 3)), "n": 3}
    check_shardings_fit(arrays, {"w": rows, "n": None}, who="load")
    with pytest.raises(
        ValueError, match=r"^load: at like\['w'\].*dimension 1 \(size 3\)"
    ):
        check_shardings_fit(
            arrays,
            {"w": NamedSharding(mesh, P(None, "model")), "n": None},
            who="load",
            root="like",
        )
    with pytest.raises(ValueError, match="prefix"):
        check_shardings_fit(arrays, [rows], who="load")


def test_an_invalid_regex_names_its_rule(mesh):
    with pytest.raises(
        ValueError, match=r"key-path rule 'layers\[0' .*not a valid regular expression"
    ):
        fx.sharding_of(fx.nn.MLP(2, 2, 4, 1, key=KEY), mesh, [("layers[0", P())])
