"""A data- and model-parallel train step across hosts, for real: 2 processes x 4
CPU devices joined by `jax.distributed` give the same losses as 1 process x 8
devices to float tolerance (the collectives between processes add in another
order: about 5e-7 apart, 1e-6 allowed), and exactly the same losses as each
other, with the model built by `sharded_init` from logical-axis rules and the
step compiled once."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np

_WORKER = """\
import json
import jax, jax.numpy as jnp, numpy as np, optax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import filterax as fx

compilations = []

def on_event(event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
        compilations.append(event)

jax.monitoring.register_event_duration_secs_listener(on_event)

mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
rules = {"mlp": "model"}
tensor_parallel = {
    "first": {"weight": ("mlp", "in"), "bias": ("mlp",)},
    "last": {"weight": ("out", "mlp")},
}
optimiser = optax.adam(1e-2)


def make_train_state(key):
    # The model and its optimiser state together: the state follows the
    # parameters' shardings, its step counter replicated.
    model = fx.nn.MLP(8, 4, 32, depth=1, key=key, axes=tensor_parallel)
    return model, optimiser.init(fx.filter(model, fx.is_array))


model, opt_state = fx.sharded_init(make_train_state, mesh, rules)(jax.random.key(0))
assert opt_state[0].count.sharding == NamedSharding(mesh, P())

@fx.filter_jit
def step(model, opt_state, x, y):
    def loss_fn(model):
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)
    loss, grads = fx.filter_value_and_grad(loss_fn)(model)
    updates, opt_state = optimiser.update(grads, opt_state, fx.filter(model, fx.is_array))
    return loss, fx.apply_updates(model, updates), opt_state

rows = NamedSharding(mesh, P("data"))
generator = np.random.default_rng(0)
target = generator.normal(size=(8, 4)).astype(np.float32)
before = len(compilations)
losses = []
for _ in range(4):
    x_host = generator.normal(size=(16, 8)).astype(np.float32)
    y_host = np.tanh(x_host @ target)
    # Every process draws the whole batch and keeps the rows its devices hold.
    x = jax.make_array_from_callback(x_host.shape, rows, lambda i: x_host[i])
    y = jax.make_array_from_callback(y_host.shape, rows, lambda i: y_host[i])
    loss, model, opt_state = step(model, opt_state, x, y)
    losses.append(float(loss.addressable_data(0)))
print(json.dumps({
    "losses": losses,
    "step_compilations": len(compilations) - before,
    "weight_spec": str(model.layers[0].weight.sharding.spec),
    "shard_shape": list(model.layers[0].weight.addressable_shards[0].data.shape),
    "processes": jax.process_count(),
}))
"""


def _result(output: str) -> dict:
    return json.loads(output.strip().splitlines()[-1])


def test_two_hosts_train_like_one_host_with_one_compilation(
    run_processes: Callable[..., list[str]],
):
    hosts = [_result(out) for out in run_processes(_WORKER, processes=2, devices=4)]
    (reference,) = [
        _result(out) for out in run_processes(_WORKER, processes=1, devices=8)
    ]
    assert [host["processes"] for host in hosts] == [2, 2]
    assert reference["processes"] == 1
    for host in [*hosts, reference]:
        assert host["step_compilations"] == 1
        # The hidden layer is split over "model" (2 devices): 32 rows -> 16.
        assert host["weight_spec"] == "P('model', None)"
        assert host["shard_shape"] == [16, 8]
    assert hosts[0]["losses"] == hosts[1]["losses"]
    np.testing.assert_allclose(hosts[0]["losses"], reference["losses"], rtol=1e-6)
    assert reference["losses"][-1] < reference["losses"][0]
