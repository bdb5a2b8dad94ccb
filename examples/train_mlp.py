"""Fit a small MLP to synthetic regression data.

The model is a `filterax.nn.MLP`: an ordinary `filterax.Module` holding a tuple
of `nn.Linear` layers and an activation function. The activation is a Python
function, not an array, and the filtered transformations handle it without any
annotation: `filter_jit` treats it as a compile-time constant and
`filter_value_and_grad` gives it a `None` gradient.

    python examples/train_mlp.py            # full run
    python examples/train_mlp.py --small    # a few seconds (used by CI)

The loss curve is written to `--out` (default: `loss.png`). The script exits
with status 1 if the loss did not fall, so it doubles as a smoke test.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import optax

import filterax as fx
from filterax import nn


def make_data(key: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
    """Noisy samples of a smooth function of two inputs."""
    x_key, noise_key = jax.random.split(key)
    x = jax.random.uniform(x_key, (n, 2), minval=-2.0, maxval=2.0)
    y = jnp.sin(1.5 * x[:, :1]) + 0.3 * x[:, 1:] ** 2
    return x, y + 0.05 * jax.random.normal(noise_key, y.shape)


BATCH_SIZE = 128


def loss_fn(model: nn.MLP, x: jax.Array, y: jax.Array) -> jax.Array:
    # Layers act on one example: `jax.vmap` maps the model over the batch.
    prediction = jax.vmap(model)(x)
    return jnp.mean((prediction - y) ** 2)


@fx.filter_jit
def train_step(
    model: nn.MLP,
    opt_state: optax.OptState,
    optimiser: optax.GradientTransformation,
    x_train: jax.Array,
    y_train: jax.Array,
    key: jax.Array,
) -> tuple[nn.MLP, optax.OptState, jax.Array]:
    # Arrays (the key included) are traced; `optimiser` holds only functions,
    # so filter_jit treats it as static. One compilation serves every step.
    index = jax.random.randint(key, (BATCH_SIZE,), 0, len(x_train))
    x, y = x_train[index], y_train[index]
    loss, grads = fx.filter_value_and_grad(loss_fn)(model, x, y)
    updates, opt_state = optimiser.update(grads, opt_state)
    model = fx.apply_updates(model, updates)
    return model, opt_state, loss


def plot_losses(losses: list[float], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # write a file; never open a window
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(5, 3.5))
    axes.plot(losses, linewidth=0.8)
    axes.set_yscale("log")
    axes.set_xlabel("training step")
    axes.set_ylabel("mean squared error of the batch\n(log scale)")
    axes.set_title("train_mlp.py: training loss")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run for CI")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="loss.png", help="where to write the plot")
    args = parser.parse_args(argv)
    steps = args.steps or (150 if args.small else 2000)
    width = 32 if args.small else 64

    data_key, model_key, batch_key = jax.random.split(jax.random.key(args.seed), 3)
    x_train, y_train = make_data(data_key, 1024)
    model = nn.MLP(
        in_size=2,
        out_size=1,
        width_size=width,
        depth=2,
        activation=jax.nn.tanh,
        key=model_key,
    )
    print(model)

    optimiser = optax.adam(3e-3)
    # The optimiser only ever sees the trainable leaves: the weights and
    # biases, not the activation or the layer sizes.
    opt_state = optimiser.init(fx.trainable(model))

    losses = []
    start = time.perf_counter()
    for step in range(steps):
        batch_key, step_key = jax.random.split(batch_key)
        model, opt_state, loss = train_step(
            model, opt_state, optimiser, x_train, y_train, step_key
        )
        losses.append(float(loss))
        if step % max(1, steps // 10) == 0 or step == steps - 1:
            print(f"step {step:5d}  batch loss {losses[-1]:.5f}")
    elapsed = time.perf_counter() - start
    print(f"{steps} steps in {elapsed:.2f}s")

    plot_losses(losses, args.out)
    print(f"loss curve written to {args.out}")

    window = max(1, min(10, steps // 10))
    first = sum(losses[:window]) / window
    last = sum(losses[-window:]) / window
    # Single batches are noisy: compare the mean loss of the first `window`
    # steps with that of the last `window`.
    averages = (
        f"the mean loss of steps 0-{window - 1} ({first:.5f}) to that of steps "
        f"{steps - window}-{steps - 1} ({last:.5f})"
    )
    if not last < 0.5 * first:
        print(f"FAILED: from {averages}: less than halved", file=sys.stderr)
        return 1
    print(f"OK: loss fell from {averages}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
