"""Checkpoints from two real processes (2 x 4 CPU devices, joined by
`jax.distributed`), each writing only its own shards, restored into this
process's 8 devices on another mesh shape."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import filterax.checkpoint as fxc

# A 1 MiB array of random bits (incompressible, so the bytes each process
# writes measure the data it wrote), the same in every process.
_ROWS, _COLUMNS = 256, 1024


def _weights() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 2**32, (_ROWS, _COLUMNS), np.uint32)


_WORKER = f"""\
import json, os
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import filterax.checkpoint as fxc

out = os.environ["CHECKPOINT_ROOT"]
weights = np.random.default_rng(0).integers(0, 2**32, ({_ROWS}, {_COLUMNS}), np.uint32)
mesh = jax.make_mesh((8,), ("x",))
split = NamedSharding(mesh, P("x"))
replicated = NamedSharding(mesh, P())
tree = {{
    "w": jax.make_array_from_callback(weights.shape, split, lambda i: weights[i]),
    "bias": jax.make_array_from_callback((4,), replicated, lambda i: np.arange(4.0)[i]),
    "keys": jax.jit(lambda: jax.random.split(jax.random.key(7), 8), out_shardings=split)(),
    "act": jax.nn.relu,
    "step": 3,
}}
fxc.save(os.path.join(out, "single"), tree)

# Steps, restored here onto another mesh shape.
other = jax.make_mesh((4, 2), ("a", "b"))
like = {{**tree, "w": jax.ShapeDtypeStruct(weights.shape, jnp.uint32,
                                         sharding=NamedSharding(other, P("b", "a")))}}
add = jax.jit(lambda w, n: w + n, out_shardings=split)
with fxc.Checkpointer(os.path.join(out, "steps"), keep=2) as checkpoints:
    for step in (1, 2, 3):
        checkpoints.save(step, {{**tree, "w": add(tree["w"], np.uint32(step))}})
    checkpoints.wait()
    steps = checkpoints.steps()
    restored = checkpoints.restore(like)
shards = restored["w"].addressable_shards
print(json.dumps({{
    "process": jax.process_index(),
    "steps": steps,
    "shards": len(shards),
    "sharding": str(restored["w"].sharding.spec),
    "equal": all(np.array_equal(np.asarray(s.data), weights[s.index] + 3) for s in shards),
}}))
"""


def _bytes_under(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def test_two_processes_write_their_own_shards_and_one_restores_all(
    run_processes: Callable[..., list[str]], tmp_path: Path
) -> None:
    outputs = run_processes(_WORKER, env={"CHECKPOINT_ROOT": str(tmp_path)})
    reports = [json.loads(out.strip().splitlines()[-1]) for out in outputs]

    # The Checkpointer in both processes: newest two steps, restored onto
    # another mesh, each process holding 4 of the 8 shards.
    for index, report in enumerate(reports):
        assert report == {
            "process": index,
            "steps": [2, 3],
            "shards": 4,
            "sharding": "P('b', 'a')",
            "equal": True,
        }

    # Each process wrote its own half of `w` (orbax's per-process files).
    arrays = tmp_path / "single" / "arrays"
    written = [_bytes_under(arrays / f"ocdbt.process_{i}") for i in range(2)]
    half = _ROWS * _COLUMNS * 4 // 2
    assert all(half <= size < half * 1.1 for size in written), written

    # One process with 8 devices, on a (2, 4) mesh the writers never had.
    mesh = jax.make_mesh((2, 4), ("a", "b"))
    like = {
        "w": jax.ShapeDtypeStruct(
            (_ROWS, _COLUMNS),
            jnp.uint32,
            sharding=NamedSharding(mesh, P(None, ("a", "b"))),
        ),
        "bias": jax.ShapeDtypeStruct(
            (4,), jnp.float32, sharding=NamedSharding(mesh, P())
        ),
        "keys": jax.ShapeDtypeStruct(
            (8,), jax.random.key(0).dtype, sharding=NamedSharding(mesh, P("b"))
        ),
        "act": jax.nn.relu,
        "step": 0,
    }
    restored = fxc.restore(tmp_path / "single", like)
    assert np.array_equal(np.asarray(restored["w"]), _weights())
    assert restored["w"].sharding == like["w"].sharding
    assert np.array_equal(np.asarray(restored["bias"]), np.arange(4.0))
    assert np.array_equal(
        np.asarray(jax.random.key_data(restored["keys"])),
        np.asarray(jax.random.key_data(jax.random.split(jax.random.key(7), 8))),
    )
    assert restored["step"] == 3
