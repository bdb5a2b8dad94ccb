"""Transfer learning with a frozen encoder and a running-statistics buffer.

Two phases:

1. *Pretraining.* An encoder and a head are trained together on task A. The
   model also keeps running statistics (mean and variance) of the encoder's
   features, used to normalise them before the head, much like a batch-norm
   layer. Those statistics are a *buffer*: arrays that the training step
   updates by hand, and that must never be touched by the optimiser. Holding
   them in `filterax.NonDifferentiable` does exactly that: they stay ordinary
   traced arrays under `filter_jit`, but every gradient there is `None`.

2. *Fine-tuning.* The encoder is frozen with
   `filterax.freeze(model, where=lambda m: m.encoder)`, the statistics are no
   longer updated, and only the head is trained on task B. The optimiser state
   is created for the differentiable leaves alone, so it holds nothing for the
   encoder.

At the end the script checks that the encoder and the buffer are bit-identical
to what pretraining left, and that the head did change.

    python examples/frozen_buffers.py [--small]
"""

from __future__ import annotations

import argparse
import math
import sys

import jax
import jax.numpy as jnp
import optax

import filterax as fx


class Linear(fx.Module):
    weight: jax.Array
    bias: jax.Array

    def __init__(self, in_size: int, out_size: int, *, key: jax.Array):
        limit = 1 / math.sqrt(in_size)
        self.weight = jax.random.uniform(
            key, (out_size, in_size), minval=-limit, maxval=limit
        )
        self.bias = jnp.zeros(out_size)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.weight @ x + self.bias


class Encoder(fx.Module):
    layers: list[Linear]

    def __init__(self, in_size: int, width: int, *, key: jax.Array):
        keys = jax.random.split(key, 2)
        self.layers = [
            Linear(in_size, width, key=keys[0]),
            Linear(width, width, key=keys[1]),
        ]

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = jax.nn.gelu(layer(x))
        return x


class RunningStats(fx.Module):
    """Exponential moving averages of the features' mean and variance."""

    mean: jax.Array
    var: jax.Array
    momentum: float = fx.field(static=True, default=0.9)

    def normalise(self, features: jax.Array) -> jax.Array:
        return (features - self.mean) / jnp.sqrt(self.var + 1e-5)

    def updated(self, batch_features: jax.Array) -> RunningStats:
        m = self.momentum
        return RunningStats(
            mean=m * self.mean + (1 - m) * batch_features.mean(axis=0),
            var=m * self.var + (1 - m) * batch_features.var(axis=0),
            momentum=m,
        )


class Model(fx.Module):
    encoder: Encoder
    stats: fx.NonDifferentiable  # holds a RunningStats: a buffer, not a parameter
    head: Linear

    def __init__(self, in_size: int, width: int, out_size: int, *, key: jax.Array):
        encoder_key, head_key = jax.random.split(key)
        self.encoder = Encoder(in_size, width, key=encoder_key)
        self.stats = fx.NonDifferentiable(
            RunningStats(mean=jnp.zeros(width), var=jnp.ones(width))
        )
        self.head = Linear(width, out_size, key=head_key)

    def features(self, x: jax.Array) -> jax.Array:
        # Once frozen, `self.encoder` is a NonDifferentiable wrapping the
        # Encoder; `unfreeze` returns the Encoder either way.
        return fx.unfreeze(self.encoder)(x)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.head(self.stats.value.normalise(self.features(x)))


def make_task(key: jax.Array, n: int, task: str) -> tuple[jax.Array, jax.Array]:
    """Two related regression tasks on the same kind of inputs."""
    x = jax.random.normal(key, (n, 4))
    if task == "A":
        y = jnp.stack([jnp.sin(x[:, 0]) + x[:, 1] * x[:, 2], jnp.cos(x[:, 3])], 1)
    else:
        y = (jnp.sin(x[:, 0]) - 0.5 * x[:, 1] * x[:, 2] + x[:, 3])[:, None]
    return x, y


def loss_fn(model: Model, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def differentiable_part(model: Model) -> Model:
    """The leaves an optimiser should see: inexact arrays outside any
    NonDifferentiable, with a single `None` per wrapper, as in the gradients."""
    return fx.trainable(model)


@fx.filter_jit
def pretrain_step(model, opt_state, optimiser, x, y):
    loss, grads = fx.filter_value_and_grad(loss_fn)(model, x, y)
    # `grads.stats` is None: the buffer is not a parameter.
    updates, opt_state = optimiser.update(grads, opt_state)
    model = fx.apply_updates(model, updates)
    # The buffer is updated by hand, outside of any gradient.
    batch_features = jax.vmap(model.features)(x)
    new_stats = model.stats.value.updated(batch_features)
    model = fx.tree_at(lambda m: m.stats, model, fx.NonDifferentiable(new_stats))
    return model, opt_state, loss


@fx.filter_jit
def finetune_step(model, opt_state, optimiser, x, y):
    loss, grads = fx.filter_value_and_grad(loss_fn)(model, x, y)
    updates, opt_state = optimiser.update(grads, opt_state)
    return fx.apply_updates(model, updates), opt_state, loss


def count_arrays(tree) -> int:
    return sum(leaf.size for leaf in jax.tree.leaves(tree) if fx.is_array(leaf))


@fx.filter_jit
def sample_batch(x_all, y_all, key):
    key, index_key = jax.random.split(key)
    index = jax.random.randint(index_key, (64,), 0, len(x_all))
    return x_all[index], y_all[index], key


def train(step_fn, model, optimiser, data, steps, label):
    opt_state = optimiser.init(differentiable_part(model))
    key = jax.random.key(1)
    for step in range(steps):
        x, y, key = sample_batch(*data, key)
        model, opt_state, loss = step_fn(model, opt_state, optimiser, x, y)
        if step % max(1, steps // 5) == 0 or step == steps - 1:
            print(f"[{label}] step {step:4d}  loss {float(loss):.5f}")
    return model, opt_state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run for CI")
    args = parser.parse_args(argv)
    steps = 60 if args.small else 600

    key_a, key_b, model_key = jax.random.split(jax.random.key(0), 3)
    model = Model(in_size=4, width=32, out_size=2, key=model_key)

    # --- 1. pretraining on task A: everything but the buffer is trained ------
    model, _ = train(
        pretrain_step,
        model,
        optax.adam(3e-3),
        make_task(key_a, 2048, "A"),
        steps,
        "pretrain",
    )

    # --- 2. fine-tuning on task B: new head, frozen encoder and buffer -------
    head_key = jax.random.key(2)
    model = fx.tree_at(lambda m: m.head, model, Linear(32, 1, key=head_key))
    model = fx.freeze(model, where=lambda m: m.encoder)
    print(model)
    pretrained = model  # immutable: nothing below can change it

    optimiser = optax.adam(1e-2)
    trainable = differentiable_part(model)
    print(f"optimiser sees {count_arrays(trainable)} of {count_arrays(model)} numbers")
    model, opt_state = train(
        finetune_step,
        model,
        optimiser,
        make_task(key_b, 2048, "B"),
        steps,
        "finetune",
    )

    # --- checks ----------------------------------------------------------
    x_b, y_b = make_task(key_b, 8, "B")
    grads = fx.filter_grad(loss_fn)(model, x_b, y_b)
    print(f"gradient: {grads}")
    no_frozen_grads = grads.encoder is None and grads.stats is None
    encoder_same = fx.tree_equal(model.encoder, pretrained.encoder, typematch=True)
    stats_same = fx.tree_equal(model.stats, pretrained.stats, typematch=True)
    head_changed = not fx.tree_equal(model.head, pretrained.head)
    state_size = count_arrays(opt_state)
    print(f"encoder bit-identical: {encoder_same}")
    print(f"buffer bit-identical:  {stats_same}")
    print(f"head changed:          {head_changed}")
    print(f"optimiser state holds {state_size} numbers (adam: 2 per parameter + 1)")
    ok = (
        no_frozen_grads
        and encoder_same
        and stats_same
        and head_changed
        and state_size == 2 * count_arrays(trainable) + 1
    )
    if not ok:
        print("FAILED", file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
