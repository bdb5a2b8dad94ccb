"""Checkpoints from two real processes (2 x 4 CPU devices, joined by
`jax.distributed`), each writing only its own shards, restored into this
process's 8 devices on another mesh shape."""

from __future__ import annotations

import json
import os
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


_DISAGREEING = """\
import json, os, time
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import filterax.checkpoint as fxc

out = os.environ["CHECKPOINT_ROOT"]
me = jax.process_index()
mesh = jax.make_mesh((8,), ("x",))
w = jax.make_array_from_callback(
    (16,), NamedSharding(mesh, P("x")), lambda i: np.arange(16.0)[i]
)
report = {}

def attempt(name, action):
    start = time.monotonic()
    try:
        action()
    except Exception as error:
        report[name] = [type(error).__name__, str(error)]
    else:
        report[name] = None
    report[name + " seconds"] = time.monotonic() - start

# A NumPy leaf of another shape on process 1.
attempt("tree", lambda: fxc.save(
    os.path.join(out, "tree"), {"w": w, "n": np.zeros(2 + me), "act": "relu"}))
# Another step number on process 1.
checkpoints = fxc.Checkpointer(os.path.join(out, "steps"))
attempt("step", lambda: checkpoints.save(3 + me, {"w": w}, wait=True))
# Agreeing again: the save goes through.
attempt("agreed", lambda: checkpoints.save(5, {"w": w}, wait=True))
checkpoints.close()
# Process 1 fails after writing its shards: process 0 hears of it at once.
import filterax.checkpoint._write as write_module
summed = write_module.write_checksums
def broken(directory, process):
    raise OSError(28, "No space left on device")
if me == 1:
    write_module.write_checksums = broken
attempt("failed", lambda: fxc.save(os.path.join(out, "failed"), {"w": w}))
write_module.write_checksums = summed
# An array on this process's devices only.
attempt("local", lambda: fxc.save(os.path.join(out, "local"), {"w": w, "l": jnp.ones(2)}))
print(json.dumps(report))
"""


def test_processes_that_disagree_fail_fast_naming_the_difference(
    run_processes: Callable[..., list[str]], tmp_path: Path
) -> None:
    root = tmp_path / "out"
    root.mkdir()
    # Bounded: a hang in any save would fail the test when the time runs out.
    outputs = run_processes(
        _DISAGREEING, env={"CHECKPOINT_ROOT": str(root)}, timeout=120
    )
    reports = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    for report in reports:
        kind, message = report["tree"]
        assert kind == "ValueError"
        assert "different trees" in message and "['n']" in message
        assert "float64[2]" in message and "float64[3]" in message
        kind, message = report["step"]
        assert kind == "ValueError"
        assert "step 3" in message and "step 4" in message
        assert report["agreed"] is None
        kind, message = report["failed"]
        assert kind == ("RuntimeError" if report is reports[0] else "OSError")
        assert "No space left on device" in message
        kind, message = report["local"]
        assert kind == "ValueError" and "['l']" in message
        assert "this process's devices only" in message
    # Nothing written by the refused saves, no partial directory left.
    assert sorted(os.listdir(root)) == ["steps"]
    assert sorted(os.listdir(root / "steps")) == ["5"]
    print({f"process {i}": r["tree seconds"] for i, r in enumerate(reports)})
