"""`tree_serialise_leaves` in a two-process run (2 x 4 CPU devices joined by
`jax.distributed`): arrays each process holds whole are saved from its local
copy; arrays split across processes are refused, pointing to
`filterax.checkpoint`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import filterax as fx

_WORKER = """\
import json, os
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import filterax as fx

# Rows of the mesh are processes, columns the devices of one process.
devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
mesh = Mesh(np.array(devices).reshape(2, 4), ("proc", "local"))
values = np.arange(32.0, dtype=np.float32).reshape(8, 4)

def global_array(spec):
    sharding = NamedSharding(mesh, spec)
    return jax.make_array_from_callback(values.shape, sharding, lambda i: values[i])

keys = jax.jit(lambda: jax.random.split(jax.random.key(5), 4),
               out_shardings=NamedSharding(mesh, P("local")))()
model = {
    "replicated": global_array(P()),
    "local": global_array(P("local")),  # split over this process's devices only
    "keys": keys,
    "name": "mlp",
}
path = os.path.join(os.environ["OUT"], f"model.{jax.process_index()}.fx")
fx.tree_serialise_leaves(path, model)
try:
    fx.tree_serialise_leaves(path + ".split", {**model, "split": global_array(P("proc"))})
    refused = None
except TypeError as error:
    refused = str(error)
print(json.dumps({"refused": refused, "leftover": os.path.exists(path + ".split")}))
"""


def test_saves_what_a_process_holds_whole_and_refuses_split_arrays(
    run_processes: Callable[..., list[str]], tmp_path: Path
) -> None:
    outputs = run_processes(_WORKER, env={"OUT": str(tmp_path)})
    values = np.arange(32.0, dtype=np.float32).reshape(8, 4)
    like = {
        "replicated": jnp.zeros((8, 4)),
        "local": jnp.zeros((8, 4)),
        "keys": jax.random.split(jax.random.key(0), 4),
        "name": "mlp",
    }
    for index, output in enumerate(outputs):
        report = json.loads(output.strip().splitlines()[-1])
        message = report["refused"]
        assert message is not None and "['split']" in message
        assert "split across processes" in message and "filterax.checkpoint" in message
        assert not report["leftover"]
        loaded = fx.tree_deserialise_leaves(tmp_path / f"model.{index}.fx", like)
        assert np.array_equal(loaded["replicated"], values)
        assert np.array_equal(loaded["local"], values)
        assert np.array_equal(
            jax.random.key_data(loaded["keys"]),
            jax.random.key_data(jax.random.split(jax.random.key(5), 4)),
        )
