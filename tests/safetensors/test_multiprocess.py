"""Loading in two real processes (2 x 4 CPU devices, joined by
`jax.distributed`): each process reads from the file only the slices its own
devices hold; and `save` from both writes one file, from process 0."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import safetensors.numpy

_WORKER = """\
import contextlib, json, os
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P
import filterax.safetensors as fxs
from filterax.safetensors import _load

root = os.environ["WEIGHTS_ROOT"]
reads = []
original = _load.tensor_reader


@contextlib.contextmanager
def spying(file, name, shape, dtype):
    with original(file, name, shape, dtype) as read:

        def spied(index):
            reads.append([name, [[part.start, part.stop] for part in index]])
            return read(index)

        yield spied


_load.tensor_reader = spying
mesh = jax.make_mesh((8,), ("x",))
like = {
    "w": jax.ShapeDtypeStruct((16, 3), jnp.float32, sharding=NamedSharding(mesh, P("x"))),
    "b": jax.ShapeDtypeStruct((3,), jnp.float32, sharding=NamedSharding(mesh, P())),
}
loaded = fxs.load(os.path.join(root, "in.safetensors"), like)
expected = np.arange(48, dtype=np.float32).reshape(16, 3)
equal = all(np.array_equal(np.asarray(s.data), expected[s.index])
            for s in loaded["w"].addressable_shards)

# Every process calls save; process 0 writes (the arrays are whole there).
fxs.save(os.path.join(root, "out.safetensors"), {"b": loaded["b"]})
multihost_utils.sync_global_devices("saved")
print(json.dumps({"process": jax.process_index(), "reads": sorted(reads), "equal": equal}),
      flush=True)
"""


def _report(output: str) -> dict:
    """A worker's report: its last JSON line (the collectives' library logs
    to the same output, sometimes after it)."""
    lines = [line for line in output.splitlines() if line.startswith("{")]
    return json.loads(lines[-1])


def test_each_process_reads_only_its_devices_slices(
    run_processes: Callable[..., list[str]], tmp_path: Path
) -> None:
    safetensors.numpy.save_file(
        {
            "w": np.arange(48, dtype=np.float32).reshape(16, 3),
            "b": np.ones(3, np.float32),
        },
        tmp_path / "in.safetensors",
    )
    outputs = run_processes(_WORKER, env={"WEIGHTS_ROOT": str(tmp_path)})
    reports = sorted(map(_report, outputs), key=lambda report: report["process"])
    assert [report["equal"] for report in reports] == [True, True]
    for report in reports:
        first = 8 * report["process"]  # process p holds rows 8p .. 8p + 7
        assert report["reads"] == sorted(
            [["b", [[None, None]]]]
            + [
                ["w", [[first + 2 * i, first + 2 * i + 2], [None, None]]]
                for i in range(4)
            ]
        )
    saved = safetensors.numpy.load_file(tmp_path / "out.safetensors")
    np.testing.assert_array_equal(saved["b"], np.ones(3, np.float32))
