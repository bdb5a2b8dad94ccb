"""Fit a neural ODE with diffrax: the vector field is a filterax Module.

The data are trajectories of a two-dimensional damped spiral, `dy/dt = A y`,
from random starting points. The model is `dy/dt = f(y)` with `f` a small
`filterax.nn.MLP` inside a `filterax.Module`; `diffrax.diffeqsolve` integrates
it (diffrax differentiates through its solver), `filter_value_and_grad` takes
the gradient of the squared error along whole trajectories, and optax updates
the MLP's weights. A filterax Module is a pytree like any other, so diffrax
needs nothing special: it is only passed to `diffrax.ODETerm`. (diffrax, and
Equinox which it builds on, come with the `diffrax` extra:
`pip install "filterax[diffrax]"`.)

    python examples/neural_ode_diffrax.py            # full run
    python examples/neural_ode_diffrax.py --small    # about 20 seconds (CI)

A figure of true and fitted trajectories, and of the training loss, is written
to `--out` (default: `neural_ode.png`). The script exits with status 1 if the
loss did not fall to a quarter of its first value, so it doubles as a smoke
test.
"""

from __future__ import annotations

import argparse
import sys
import time

import diffrax
import jax
import jax.numpy as jnp
import optax

import filterax as fx
from filterax import nn

# The true dynamics: a spiral turning once in about 6 time units, and decaying.
SPIRAL = jnp.array([[-0.1, -1.0], [1.0, -0.1]])


def true_field(t: jax.Array, y: jax.Array, args: None) -> jax.Array:
    return SPIRAL @ y


def solve(field: diffrax.AbstractTerm, ts: jax.Array, y0: jax.Array) -> jax.Array:
    """`y` at every time of `ts`, from `y(ts[0]) = y0`: Tsit5 with an
    adaptive step, as a library user would write it."""
    solution = diffrax.diffeqsolve(
        field,
        diffrax.Tsit5(),
        t0=ts[0],
        t1=ts[-1],
        dt0=ts[1] - ts[0],
        y0=y0,
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=1e-3, atol=1e-6),
        max_steps=4096,
    )
    assert solution.ys is not None
    return solution.ys


def make_data(key: jax.Array, n: int, length: int) -> tuple[jax.Array, jax.Array]:
    """`n` trajectories of the spiral at `length` evenly spaced times."""
    ts = jnp.linspace(0.0, 10.0, length)
    y0 = jax.random.uniform(key, (n, 2), minval=-0.6, maxval=1.0)
    term = diffrax.ODETerm(true_field)
    ys = jax.jit(jax.vmap(lambda y0: solve(term, ts, y0)))(y0)
    return ts, ys


class VectorField(fx.Module):
    """`f(y)`: the learned right-hand side, in diffrax's `(t, y, args)` form."""

    mlp: nn.MLP

    def __init__(self, width: int, depth: int, *, key: jax.Array):
        self.mlp = nn.MLP(
            in_size=2,
            out_size=2,
            width_size=width,
            depth=depth,
            activation=jax.nn.softplus,
            key=key,
        )

    def __call__(self, t: jax.Array, y: jax.Array, args: None) -> jax.Array:
        return self.mlp(y)


class NeuralODE(fx.Module):
    """The trajectory of `dy/dt = field(y)` through given times."""

    field: VectorField

    def __call__(self, ts: jax.Array, y0: jax.Array) -> jax.Array:
        # The Module goes into diffrax as it is: its arrays are the leaves
        # that diffrax differentiates through.
        return solve(diffrax.ODETerm(self.field), ts, y0)


def predict(model: NeuralODE, ts: jax.Array, y0: jax.Array) -> jax.Array:
    """The model's trajectories from each starting point of `y0`."""
    return jax.vmap(model, in_axes=(None, 0))(ts, y0)


def loss_fn(model: NeuralODE, ts: jax.Array, ys: jax.Array) -> jax.Array:
    return jnp.mean((predict(model, ts, ys[:, 0]) - ys) ** 2)


@fx.filter_jit
def train_step(
    model: NeuralODE,
    opt_state: optax.OptState,
    optimiser: optax.GradientTransformation,
    ts: jax.Array,
    ys: jax.Array,
) -> tuple[NeuralODE, optax.OptState, jax.Array]:
    loss, grads = fx.filter_value_and_grad(loss_fn)(model, ts, ys)
    updates, opt_state = optimiser.update(grads, opt_state)
    return fx.apply_updates(model, updates), opt_state, loss


def plot(
    ts: jax.Array,
    ys: jax.Array,
    fitted: jax.Array,
    losses: list[float],
    path: str,
) -> None:
    import matplotlib

    matplotlib.use("Agg")  # write a file; never open a window
    import matplotlib.pyplot as plt

    figure, (phase, curve) = plt.subplots(1, 2, figsize=(9, 4))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i in range(len(ys)):
        colour = colours[i % len(colours)]
        phase.plot(ys[i, :, 0], ys[i, :, 1], color=colour, linewidth=1.5)
        phase.plot(fitted[i, :, 0], fitted[i, :, 1], "--", color=colour, linewidth=1)
        phase.plot(ys[i, 0, 0], ys[i, 0, 1], "o", color=colour, markersize=4)
    phase.plot([], [], "k-", label="true")
    phase.plot([], [], "k--", label="neural ODE")
    phase.set_xlabel("$y_0$")
    phase.set_ylabel("$y_1$")
    phase.set_title(f"trajectories over t in [0, {float(ts[-1]):g}]")
    phase.legend()
    curve.plot(losses, linewidth=0.8)
    curve.set_yscale("log")
    curve.set_xlabel("training step")
    curve.set_ylabel("mean squared error (log scale)")
    curve.set_title("training loss")
    figure.suptitle("neural_ode_diffrax.py")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run for CI")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="neural_ode.png", help="the figure's file")
    args = parser.parse_args(argv)
    steps = args.steps or (240 if args.small else 1500)
    n, length = (32, 40) if args.small else (256, 100)
    width, depth = (32, 2) if args.small else (64, 2)

    data_key, model_key = jax.random.split(jax.random.key(args.seed))
    ts, ys = make_data(data_key, n, length)
    model = NeuralODE(VectorField(width, depth, key=model_key))
    print(model)

    optimiser = optax.adabelief(3e-3)
    opt_state = optimiser.init(fx.trainable(model))

    losses = []
    start = time.perf_counter()
    for step in range(steps):
        # Fitted from the start of each trajectory first, then whole: fitting
        # long trajectories from the beginning tends to settle on a model
        # that only decays to the origin. (Each length compiles once.)
        length = ts.shape[0] // 4 if step < steps // 3 else ts.shape[0]
        model, opt_state, loss = train_step(
            model, opt_state, optimiser, ts[:length], ys[:, :length]
        )
        losses.append(float(loss))
        if step % max(1, steps // 10) == 0 or step == steps - 1:
            print(f"step {step:5d}  loss {losses[-1]:.5f}  ({length} times)")
    print(f"{steps} steps in {time.perf_counter() - start:.2f}s (two compilations)")

    shown = ys[:6]
    fitted = fx.filter_jit(predict)(model, ts, shown[:, 0])
    plot(ts, shown, fitted, losses, args.out)
    print(f"figure written to {args.out}")

    first, last = losses[0], sum(losses[-5:]) / len(losses[-5:])
    if not last < 0.25 * first:
        print(
            f"FAILED: the loss went from {first:.5f} to {last:.5f} (mean of the "
            "last 5 steps): not below a quarter",
            file=sys.stderr,
        )
        return 1
    print(f"OK: the loss fell from {first:.5f} to {last:.5f} (mean of the last 5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
