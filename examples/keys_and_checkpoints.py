"""Keys that live in the model, and checkpoints that resume bit for bit.

Each dropout layer owns its own typed PRNG key (`jax.random.key`), stored as an
ordinary field. filterax knows what a key array is (`filterax.is_key_array`):
`filter_jit` traces it like any array (new key values never recompile), and
`filter_grad` gives it a `None` gradient, so optax and `apply_updates` leave it
alone. After every step the training step advances every key in the model.

A first run trains to the end without interruption: the reference. A second
run saves the whole training state (model, keys, optimiser state, data key and
step counter) every few steps with `filterax.checkpoint.Checkpointer`, which
writes in the background while training goes on and keeps the newest two
steps, and then "crashes" part-way. A third run resumes: it restores the
latest complete step into an abstract template (`filter_eval_shape`: nothing
is built just to be overwritten) and trains to the end. The script asserts
that the replayed losses and the final state are bit-identical to the
reference. (For one host and one file, `tree_serialise_leaves` and
`tree_deserialise_leaves` do the same job without orbax.)

    python examples/keys_and_checkpoints.py [--small] [--checkpoint DIR]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float, PRNGKeyArray

import filterax as fx
import filterax.checkpoint


class Linear(fx.Module):
    """Acts on a batch: `x @ weight.T + bias`."""

    weight: Float[Array, "out in"]
    bias: Float[Array, " out"]

    def __init__(self, in_size: int, out_size: int, *, key: PRNGKeyArray):
        limit = 1 / math.sqrt(in_size)
        self.weight = jax.random.uniform(
            key, (out_size, in_size), minval=-limit, maxval=limit
        )
        self.bias = jnp.zeros(out_size)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.weight.T + self.bias


class Dropout(fx.Module):
    """Zeroes each activation with probability `rate`, using its own key."""

    key: PRNGKeyArray
    rate: float = fx.field(static=True)

    def __call__(self, x: jax.Array) -> jax.Array:
        keep = jax.random.bernoulli(self.key, 1 - self.rate, x.shape)
        return jnp.where(keep, x / (1 - self.rate), 0.0)


class Net(fx.Module):
    hidden: Linear
    dropout_hidden: Dropout
    features: Linear
    dropout_features: Dropout
    out: Linear

    def __init__(self, *, key: PRNGKeyArray):
        keys = jax.random.split(key, 5)
        self.hidden = Linear(8, 64, key=keys[0])
        self.dropout_hidden = Dropout(keys[1], rate=0.1)
        self.features = Linear(64, 64, key=keys[2])
        self.dropout_features = Dropout(keys[3], rate=0.2)
        self.out = Linear(64, 1, key=keys[4])

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.dropout_hidden(jax.nn.relu(self.hidden(x)))
        x = self.dropout_features(jax.nn.relu(self.features(x)))
        return self.out(x)


class TrainState(fx.Module):
    """Everything needed to resume training exactly."""

    model: Net
    opt_state: optax.OptState
    data_key: PRNGKeyArray
    step: jax.Array  # an array, not a Python int: a new value never recompiles


def advance_keys(tree):
    """Replaces every key array in `tree` by a fresh key derived from it."""
    return jax.tree.map(
        lambda leaf: jax.random.split(leaf)[0] if fx.is_key_array(leaf) else leaf,
        tree,
    )


OPTIMISER = optax.adam(3e-3)


def initial_state(seed: int) -> TrainState:
    model_key, data_key = jax.random.split(jax.random.key(seed))
    model = Net(key=model_key)
    opt_state = OPTIMISER.init(fx.filter(model, fx.is_inexact_array))
    return TrainState(model, opt_state, data_key, jnp.array(0, jnp.int32))


def target(x: jax.Array) -> jax.Array:
    return jnp.sin(x[:, :4].sum(axis=1, keepdims=True)) + 0.1 * x[:, 4:5]


def loss_fn(model: Net, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((model(x) - y) ** 2)


@fx.filter_jit
def train_step(state: TrainState) -> tuple[TrainState, jax.Array]:
    data_key, batch_key = jax.random.split(state.data_key)
    x = jax.random.normal(batch_key, (128, 8))
    loss, grads = fx.filter_value_and_grad(loss_fn)(state.model, x, target(x))
    # Key arrays are not differentiable: their gradient is None.
    updates, opt_state = OPTIMISER.update(grads, state.opt_state)
    model = advance_keys(fx.apply_updates(state.model, updates))
    return TrainState(model, opt_state, data_key, state.step + 1), loss


def run(
    state: TrainState,
    until: int,
    checkpoints: filterax.checkpoint.Checkpointer | None = None,
    every: int = 1,
):
    """Trains up to step `until`; with `checkpoints`, saves the state every
    `every` steps (before that step runs) without waiting for the write."""
    losses = []
    start = int(state.step)
    while int(state.step) < until:
        step = int(state.step)
        if checkpoints is not None and step > start and step % every == 0:
            checkpoints.save(step, state)  # returns while it writes
            print(f"step {step:4d}  checkpoint started")
        state, loss = train_step(state)
        losses.append(float(loss))
        if int(state.step) % max(1, until // 8) == 0:
            print(f"step {int(state.step):4d}  loss {losses[-1]:.5f}")
    return state, losses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--small", action="store_true", help="a quick run for CI")
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="checkpoint directory, which must not hold steps yet (default: a temp dir)",
    )
    args = parser.parse_args(argv)
    steps = 40 if args.small else 1000
    every = steps // 8
    crash = steps * 5 // 8 + every // 2  # between two checkpoints

    with tempfile.TemporaryDirectory() as tmp:
        directory = args.checkpoint or os.path.join(tmp, "run")

        state = initial_state(seed=0)
        print("keys in the model:", fx.filter(state.model, fx.is_key_array))

        print("--- uninterrupted run ---")
        final, losses = run(state, steps)

        print(f"--- a run that saves every {every} steps and crashes at {crash} ---")
        with filterax.checkpoint.Checkpointer(directory, keep=2) as checkpoints:
            run(initial_state(seed=0), crash, checkpoints, every)
        # Leaving the block waits for the save in flight; after a real crash
        # that save may be lost, and is then invisible: the resume below takes
        # the latest complete step either way.

        print("--- resumed from the latest complete step ---")
        with filterax.checkpoint.Checkpointer(directory, keep=2) as checkpoints:
            print("complete steps:", checkpoints.steps())
            resume_from = checkpoints.latest_step()
            assert resume_from is not None
            # Any state of the same structure, shapes, dtypes and key
            # implementation serves as the template: here an abstract one.
            like = fx.filter_eval_shape(initial_state, 123)
            restored = checkpoints.restore(like)
            assert int(restored.step) == resume_from
            print(f"restored step {resume_from}")
            resumed, resumed_losses = run(restored, steps, checkpoints, every)

    same_losses = resumed_losses == losses[resume_from:]  # exact float equality
    same_state = fx.tree_equal(resumed, final, typematch=True)
    print(f"replayed losses identical: {same_losses}")
    print(f"final state identical (parameters, keys, optimiser): {same_state}")
    quarter = max(1, steps // 4)
    fell = sum(losses[-quarter:]) < sum(losses[:quarter])
    print(f"loss fell: {fell}")
    if not (same_losses and same_state and fell):
        print("FAILED", file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
