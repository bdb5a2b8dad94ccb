"""Train on some components of a multi-part loss, monitor the rest, inside
`jax.lax.scan`.

The loss is a `Losses` Module of named scalars: a data fit, a smoothness
penalty and the squared weight norm. Each training step runs the model once
with `filter_vjp` and pulls back a *cotangent* that says which components to
train: ones for the trained fields, `None` for the others. The `None` fields
are still computed and reported, but cost no backward work at all: the compiled
backward pass is the one for a loss made of the trained components only.

Training has two phases with different cotangents (fit only, then fit plus ten
times the smoothness penalty); the weight norm is only ever monitored. Each phase runs a jitted
`lax.scan` over chunks of steps and prints the losses after every chunk.

    python examples/custom_scan_vjp.py            # full run
    python examples/custom_scan_vjp.py --small    # a few steps (used by CI)

Exits with status 1 if the fit loss did not fall.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import filterax as fx


class MLP(fx.Module):
    """A one-hidden-layer perceptron on scalar inputs, batched over the first
    axis."""

    hidden_weight: jax.Array
    hidden_bias: jax.Array
    out_weight: jax.Array
    activation: str = fx.field(static=True)

    def __init__(self, width: int, *, key: jax.Array, activation: str = "tanh"):
        k1, k2, k3 = jax.random.split(key, 3)
        self.hidden_weight = 2.0 * jax.random.normal(k1, (1, width))
        self.hidden_bias = jax.random.normal(k2, (width,))
        self.out_weight = jax.random.normal(k3, (width, 1)) / width**0.5
        self.activation = activation

    def __call__(self, x: jax.Array) -> jax.Array:
        hidden = getattr(jnp, self.activation)(
            x @ self.hidden_weight + self.hidden_bias
        )
        return hidden @ self.out_weight


class Losses(fx.Module):
    """Named loss components, all scalars."""

    fit: jax.Array
    smooth: jax.Array
    weight_norm: jax.Array


def losses(model: MLP, x: jax.Array, y: jax.Array) -> Losses:
    grid = jnp.linspace(-1.0, 1.0, 64)[:, None]
    curvature = jnp.diff(model(grid)[:, 0], n=2)
    return Losses(
        fit=((model(x) - y) ** 2).mean(),
        smooth=(curvature**2).sum(),
        weight_norm=sum((w**2).sum() for w in jax.tree.leaves(model)),
    )


def make_train_chunk(trained: Losses, learning_rate: float) -> Callable[..., Any]:
    """A jitted function running one `lax.scan` over a chunk of batches, with
    `trained` as the cotangent of every step."""

    def step(model: MLP, batch: tuple[jax.Array, jax.Array]) -> tuple[MLP, Losses]:
        out, vjp_fn = fx.filter_vjp(losses, model, *batch)
        model_grad, _, _ = vjp_fn(trained)
        update = jax.tree.map(lambda g: -learning_rate * g, model_grad)
        return fx.apply_updates(model, update), out

    @fx.filter_jit
    def train_chunk(model: MLP, xs: jax.Array, ys: jax.Array) -> tuple[MLP, Losses]:
        return jax.lax.scan(step, model, (xs, ys))

    return train_chunk


def make_batches(key: jax.Array, steps: int, batch: int) -> tuple[jax.Array, ...]:
    x_key, noise_key = jax.random.split(key)
    xs = jax.random.uniform(x_key, (steps, batch, 1), minval=-1.0, maxval=1.0)
    ys = jnp.sin(3.0 * xs) + 0.1 * jax.random.normal(noise_key, xs.shape)
    return xs, ys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a few steps only")
    args = parser.parse_args()
    chunks, steps_per_chunk = (2, 20) if args.small else (8, 250)

    model = MLP(32, key=jax.random.key(0))
    one = jnp.ones(())
    phases = [
        ("fit only", Losses(fit=one, smooth=None, weight_norm=None)),
        ("fit + smooth", Losses(fit=one, smooth=10 * one, weight_norm=None)),
    ]
    data_key = jax.random.key(1)
    first_fit: float | None = None
    step = 0
    last_fit = float("inf")
    start = time.perf_counter()
    for phase, trained in phases:
        train_chunk = make_train_chunk(trained, learning_rate=0.05)
        print(f"phase: {phase}")
        for _ in range(chunks):
            data_key, key = jax.random.split(data_key)
            model, history = train_chunk(model, *make_batches(key, steps_per_chunk, 64))
            if first_fit is None:
                first_fit = float(history.fit[0])
            # Per-batch losses are noisy: report each component's chunk mean.
            means = jax.tree.map(lambda h: float(h.mean()), history)
            last_fit = means.fit
            step += steps_per_chunk
            print(
                f"  steps {step - steps_per_chunk + 1:>4}-{step:<4}  fit {means.fit:.4f}"
                f"  smooth {means.smooth:.5f}  weight_norm {means.weight_norm:.1f}"
            )
    print(
        f"fit loss {first_fit:.4f} -> {last_fit:.4f} "
        f"in {time.perf_counter() - start:.1f}s"
    )
    return 0 if first_fit is not None and last_fit < first_fit else 1


if __name__ == "__main__":
    sys.exit(main())
