"""After a save, no host copy of the arrays stays cached on them: measured with
the resident memory of a fresh process, after handing the memory malloc keeps
in its arenas back to the system (`numpy.asarray` of a sharded `jax.Array`
caches the whole value on the array, as a control shows)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

_MEASURE = """\
import ctypes, gc, json, os, sys
import jax
jax.config.update("jax_num_cpu_devices", 8)
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import filterax as fx
import filterax.checkpoint as fxc

def resident_mib():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

mesh = jax.make_mesh((8,), ("x",))
make = jax.jit(lambda: jax.random.bits(jax.random.key(0), (32 * 2**20,), jnp.uint32),
               out_shardings=NamedSharding(mesh, P("x")))
arrays = {name: make().block_until_ready()
          for name in ("warm-up", "single", "orbax", "control")}
out = sys.argv[1]

def growth(action):
    gc.collect()
    # Memory the writers freed but malloc kept in its arenas is not a cache.
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    before = resident_mib()
    action()
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return resident_mib() - before

# A first save of an array of the same size warms up both writers (thread
# pools, buffers malloc keeps): what the measured saves add is theirs alone.
fxc.save(os.path.join(out, "warm-up"), arrays["warm-up"])
fx.tree_serialise_leaves(os.path.join(out, "warm-up.fx"), arrays["warm-up"])
print(json.dumps({
    "tree_serialise_leaves": growth(
        lambda: fx.tree_serialise_leaves(os.path.join(out, "model.fx"), arrays["single"])),
    "checkpoint.save": growth(
        lambda: fxc.save(os.path.join(out, "ckpt"), arrays["orbax"])),
    "numpy.asarray": growth(lambda: np.asarray(arrays["control"])),
}))
"""


def test_saves_leave_no_host_copy_cached_on_the_arrays(tmp_path: Path) -> None:
    script = tmp_path / "measure.py"
    script.write_text(textwrap.dedent(_MEASURE))
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    growth = json.loads(result.stdout.strip().splitlines()[-1])
    # Each array is 128 MiB: a cached copy would keep all of it resident.
    # Orbax's writers may keep a few buffers of their own (up to ~20 MiB seen).
    assert growth["numpy.asarray"] > 120, growth
    assert growth["tree_serialise_leaves"] < 48, growth
    assert growth["checkpoint.save"] < 48, growth
