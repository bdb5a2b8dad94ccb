"""Train on some components of a multi-part loss, monitor the rest, inside
`filter_scan`.

The loss is a `Losses` Module of named scalars: a data fit, a smoothness
penalty and the squared weight norm. Each training step runs the model once
with `filter_vjp` and pulls back a *cotangent* that says which components to
train: ones for the trained fields, `None` for the others. The `None` fields
are still computed and reported, but cost no backward work at all: the compiled
backward pass is the one for a loss made of the trained components only.

Training has two phases with different cotangents (fit only, then fit plus ten
times the smoothness penalty); the weight norm is only ever monitored. Each
phase runs a jitted `filter_scan` over chunks of steps and prints the losses
after every chunk. The scan's carry is a `TrainState`: the model, a step
counter and the phase's name, a plain string that `jax.lax.scan` could not
carry. Beside it runs the same training written by hand around `lax.scan`
(partition the carry into arrays and the rest, combine inside the body); the
script checks that both give the same model and the same losses.

    python examples/custom_scan_vjp.py            # full run
    python examples/custom_scan_vjp.py --small    # a few steps (used by CI)

The per-step losses are plotted to `--out` (default: `custom_scan_vjp.png`).
Exits with status 1 if the fit loss did not fall or the two versions disagree.
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


class TrainState(fx.Module):
    """The carry of the training scan."""

    model: MLP
    steps: jax.Array  # an int32 counter, traced
    phase: str  # a Python value: static, part of the compiled program


def make_step(trained: Losses, learning_rate: float) -> Callable[..., Any]:
    """One training step, with `trained` as its cotangent."""

    def step(
        state: TrainState, batch: tuple[jax.Array, jax.Array]
    ) -> tuple[TrainState, Losses]:
        out, vjp_fn = fx.filter_vjp(losses, state.model, *batch)
        model_grad, _, _ = vjp_fn(trained)
        update = jax.tree.map(lambda g: -learning_rate * g, model_grad)
        model = fx.apply_updates(state.model, update)
        return TrainState(model, state.steps + 1, state.phase), out

    return step


def make_train_chunk(trained: Losses, learning_rate: float) -> Callable[..., Any]:
    """A jitted function running one `filter_scan` over a chunk of batches."""
    step = make_step(trained, learning_rate)

    @fx.filter_jit
    def train_chunk(
        state: TrainState, xs: jax.Array, ys: jax.Array
    ) -> tuple[TrainState, Losses]:
        return fx.filter_scan(step, state, (xs, ys))

    return train_chunk


def make_train_chunk_by_hand(
    trained: Losses, learning_rate: float
) -> Callable[..., Any]:
    """The same, threading the carry through `jax.lax.scan` by hand: only
    arrays may cross the scan, so the rest is closed over and put back."""
    step = make_step(trained, learning_rate)

    @fx.filter_jit
    def train_chunk(
        state: TrainState, xs: jax.Array, ys: jax.Array
    ) -> tuple[TrainState, Losses]:
        arrays, rest = fx.partition(state, fx.is_array)

        def array_step(arrays: TrainState, batch: tuple) -> tuple[TrainState, Losses]:
            new_state, out = step(fx.combine(arrays, rest), batch)
            new_arrays, _ = fx.partition(new_state, fx.is_array)
            return new_arrays, out  # trusting that `rest` did not change

        arrays, history = jax.lax.scan(array_step, arrays, (xs, ys))
        return fx.combine(arrays, rest), history

    return train_chunk


def make_batches(key: jax.Array, steps: int, batch: int) -> tuple[jax.Array, ...]:
    x_key, noise_key = jax.random.split(key)
    xs = jax.random.uniform(x_key, (steps, batch, 1), minval=-1.0, maxval=1.0)
    ys = jnp.sin(3.0 * xs) + 0.1 * jax.random.normal(noise_key, xs.shape)
    return xs, ys


def plot_history(
    history: list[Losses], phases: list[tuple[int, str]], path: str
) -> None:
    """Plots the per-step losses: the two losses that some phase trains on a log
    scale above, the monitored weight norm (a hundred times larger, on its own
    scale) below, with a line where each phase starts."""
    import matplotlib

    matplotlib.use("Agg")  # write a file; never open a window
    import matplotlib.pyplot as plt

    figure, (losses_axes, norm_axes) = plt.subplots(
        2, 1, figsize=(6.5, 5), sharex=True, height_ratios=(2, 1)
    )
    series = {
        name: jnp.concatenate([getattr(h, name) for h in history])
        for name in ("fit", "smooth", "weight_norm")
    }
    losses_axes.plot(series["fit"], label="fit (trained in both phases)", lw=0.8)
    losses_axes.plot(series["smooth"], label="smooth (trained in phase 2, x10)", lw=0.8)
    losses_axes.set_yscale("log")
    losses_axes.set_ylabel("loss per batch (log scale)")
    norm_axes.plot(series["weight_norm"], color="tab:green", lw=0.8)
    norm_axes.set_ylabel("weight norm\n(monitored only)")
    norm_axes.set_xlabel("training step")
    for axes in (losses_axes, norm_axes):
        for start, _ in phases[1:]:
            axes.axvline(start, color="grey", linestyle="--", linewidth=1)
    for start, name in phases:
        losses_axes.annotate(
            f"phase: {name}",
            xy=(start, 1),
            xycoords=("data", "axes fraction"),
            xytext=(4, -4),
            textcoords="offset points",
            va="top",
            fontsize=8,
            color="dimgrey",
        )
    losses_axes.legend(loc="lower left", fontsize=8)
    losses_axes.set_title("custom_scan_vjp.py: trained and monitored losses")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a few steps only")
    parser.add_argument("--out", default="custom_scan_vjp.png", help="the plot")
    args = parser.parse_args()
    chunks, steps_per_chunk = (2, 20) if args.small else (8, 250)

    model = MLP(32, key=jax.random.key(0))
    one = jnp.ones(())
    phases = [
        ("fit only", Losses(fit=one, smooth=None, weight_norm=None)),
        ("fit + smooth", Losses(fit=one, smooth=10 * one, weight_norm=None)),
    ]
    data_key = jax.random.key(1)
    state = TrainState(model, jnp.array(0), "")
    by_hand = state
    history: list[Losses] = []
    phase_starts: list[tuple[int, str]] = []
    largest_difference = 0.0
    start = time.perf_counter()
    for phase, trained in phases:
        train_chunk = make_train_chunk(trained, learning_rate=0.05)
        train_chunk_by_hand = make_train_chunk_by_hand(trained, learning_rate=0.05)
        state = TrainState(state.model, state.steps, phase)
        by_hand = TrainState(by_hand.model, by_hand.steps, phase)
        print(f"phase: {phase}")
        phase_starts.append((int(state.steps), phase))
        for _ in range(chunks):
            data_key, key = jax.random.split(data_key)
            batches = make_batches(key, steps_per_chunk, 64)
            state, chunk_history = train_chunk(state, *batches)
            by_hand, chunk_history_by_hand = train_chunk_by_hand(by_hand, *batches)
            history.append(chunk_history)
            largest_difference = max(
                largest_difference,
                *(
                    float(jnp.abs(a - b).max())
                    for a, b in zip(
                        jax.tree.leaves((state.model, chunk_history)),
                        jax.tree.leaves((by_hand.model, chunk_history_by_hand)),
                    )
                ),
            )
            # Per-batch losses are noisy: report each component's chunk mean.
            means = jax.tree.map(lambda h: float(h.mean()), chunk_history)
            step = int(state.steps)
            print(
                f"  steps {step - steps_per_chunk + 1:>4}-{step:<4}  fit {means.fit:.4f}"
                f"  smooth {means.smooth:.5f}  weight_norm {means.weight_norm:.1f}"
            )
    first_fit = float(history[0].fit[0])
    last_fit = float(history[-1].fit.mean())
    print(
        f"fit loss {first_fit:.4f} -> {last_fit:.4f} "
        f"in {time.perf_counter() - start:.1f}s (both versions)"
    )
    agree = largest_difference <= 1e-5 and state.phase == by_hand.phase
    print(
        f"filter_scan and the hand-threaded lax.scan "
        f"{'agree' if agree else 'DISAGREE'}: largest difference "
        f"{largest_difference:.2e} over models and losses"
    )
    plot_history(history, phase_starts, args.out)
    print(f"loss curves written to {args.out}")
    return 0 if agree and last_fit < first_fit else 1


if __name__ == "__main__":
    sys.exit(main())
