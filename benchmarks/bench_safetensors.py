"""Loading a safetensors checkpoint onto 8 devices: host memory of
`filterax.safetensors.load` onto shardings, against reading the whole file
and then placing it.

The model is eight float32 matrices whose total is 8 times one device's
share; every matrix is split 8 ways (by rows) over a one-axis mesh of 8
simulated CPU devices. Each way of loading runs in a fresh process, and
reports:

- host staging: the peak of the host buffers allocated while loading
  (`tracemalloc`, which counts NumPy's and Python's allocations, not the
  devices' own memory): what the loader holds on the host on the way to the
  devices;
- resident over result: the peak resident memory of the process while loading
  (`VmHWM`, reset just before) less its resident memory once loaded, with the
  loaded arrays alive. On a CPU backend the devices' memory is the process's
  own, so the loaded model itself is subtracted; what is left is what the
  loader held beyond its result, pages of the file it mapped included;
- the load time (wall time on this machine, asserted nowhere).

The two ways:

- `filterax.safetensors.load(path, like)`, `like` with the shardings of
  `sharding_of`: each shard is read with `safe_open(...).get_slice`, copied to
  its devices and freed before the next; the file is open (mapped) for one
  tensor at a time. Expected: staging of one shard (a fraction of one share),
  resident over result about one tensor's pages (here one share);
- `safetensors.numpy.load_file(path)` then `filter_shard` (what a user
  without a loader writes): the whole model on the host first, so its
  staging is the whole model. (Its resident peak equals its result on CPU
  only because XLA's CPU client adopts the host buffers as device memory; on
  an accelerator the host copy comes on top.)

The target: the peak host memory of the load near one device's share, not
the whole model.

Run: `python benchmarks/bench_safetensors.py [--small]`
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from typing import Any

MIB = 2**20
MATRICES = 8
DEVICES = 8

# Run in a fresh process per way of loading: `sys.argv[1:]` are the way, the
# file, the matrix shape. Prints one JSON line of figures.
_WORKER = """\
import json, os, sys, time, tracemalloc
import jax
jax.config.update("jax_num_cpu_devices", 8)
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P
import filterax as fx
import filterax.safetensors
import safetensors.numpy

way, path, rows, columns, matrices = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
mesh = jax.make_mesh((8,), ("x",))
like = {f"layers.{i}": jax.ShapeDtypeStruct((rows, columns), jnp.float32)
        for i in range(matrices)}
shardings = fx.sharding_of(like, mesh, [(r".*", P("x", None))])
like = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                    like, shardings)
# Warm up the transfers and array creation on a small array (not measured).
fx.filter_shard(np.zeros((8, 8), np.float32), shardings["layers.0"]).block_until_ready()


def status(field):
    with open("/proc/self/status") as lines:
        for line in lines:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024


def load():
    if way == "filterax":
        return fx.safetensors.load(path, like)
    tensors = safetensors.numpy.load_file(path)
    return fx.filter_shard({name: tensors[name] for name in like}, shardings)


with open("/proc/self/clear_refs", "w") as clear:
    clear.write("5")  # resets VmHWM to the current resident memory
tracemalloc.start()
start = time.perf_counter()
loaded = jax.block_until_ready(load())
seconds = time.perf_counter() - start
staging = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
peak, after = status("VmHWM"), status("VmRSS")
expected = np.load(path + ".check.npy")
assert all(np.array_equal(np.asarray(loaded[f"layers.{i}"])[:, 0], expected[i])
           for i in range(matrices))
assert all(loaded[n].sharding == shardings[n] for n in like)
print(json.dumps({"staging": staging, "over_result": peak - after, "seconds": seconds}))
"""


def write_model(path: str, total_bytes: int) -> tuple[int, int]:
    """Writes the model's file (and, beside it, its first column of each matrix
    to check the loads against); returns the matrix shape."""
    import numpy as np  # only the parent writes the file: workers load it

    columns = 1024
    rows = total_bytes // (MATRICES * columns * 4)
    rows -= rows % DEVICES
    generator = np.random.default_rng(0)
    tensors = {
        f"layers.{i}": generator.standard_normal((rows, columns), np.float32)
        for i in range(MATRICES)
    }
    import safetensors.numpy  # the optional extra this benchmark is about

    safetensors.numpy.save_file(tensors, path)
    np.save(path + ".check.npy", np.stack([t[:, 0] for t in tensors.values()]))
    return rows, columns


def measure(way: str, path: str, rows: int, columns: int) -> dict[str, Any]:
    """One way of loading (`"filterax"` or `"whole file"`), in a fresh process."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_WORKER), way, path]
        + [str(rows), str(columns), str(MATRICES)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"the {way} worker failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def run(total_mib: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "model.safetensors")
        rows, columns = write_model(path, total_mib * MIB)
        model = MATRICES * rows * columns * 4
        figures = {
            "model": model,
            "share": model // DEVICES,
            "shard": rows * columns * 4 // DEVICES,
            "filterax": measure("filterax", path, rows, columns),
            "whole file": measure("whole file", path, rows, columns),
        }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="a 32 MiB model")
    args = parser.parse_args()
    figures = run(32 if args.small else 512)
    share = figures["share"]
    print(
        f"model {figures['model'] / MIB:.0f} MiB on {DEVICES} devices: one device's "
        f"share {share / MIB:.0f} MiB, one shard of one matrix "
        f"{figures['shard'] / MIB:.1f} MiB"
    )
    print(f"{'':<34}{'host staging':>20}{'resident over result':>24}{'load':>9}")
    for way, label in (
        ("filterax", "filterax.safetensors.load"),
        ("whole file", "load_file, then filter_shard"),
    ):
        row = figures[way]
        print(
            f"{label:<34}"
            f"{row['staging'] / MIB:>8.1f} MiB ({row['staging'] / share:4.2f} x)"
            f"{row['over_result'] / MIB:>12.1f} MiB ({row['over_result'] / share:4.2f} x)"
            f"{row['seconds']:>8.2f}s"
        )
    print("(x: times one device's share)")


if __name__ == "__main__":
    main()
