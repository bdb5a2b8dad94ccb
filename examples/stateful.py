"""State in the model: a running-statistics buffer in a `jax.Ref` and dropout
driven by an `RngStream`, trained with `filter_jit` and optax.

The model normalises its hidden features. In training it uses the statistics of
the batch and updates running averages of them, kept in two `jax.Ref`s inside
the model; in inference it uses those running averages. Dropout draws its keys
from a `filterax.RngStream` held by the model: a key and a counter (also a Ref)
that advances on every draw. Nothing about either is threaded through the
training step: the step takes the model and returns it, `filter_jit` traces the
Refs and makes their writes visible after the call, `filter_value_and_grad`
gives them no gradient, and optax never sees them.

Beside it runs the same training written in plain JAX, with the statistics, the
dropout key and its counter passed in and returned by hand. Every few steps the
script prints both losses side by side; at the end it checks that the losses,
the parameters, the statistics and the counter agree bit for bit.

    python examples/stateful.py            # full run
    python examples/stateful.py --small    # a few seconds (used by CI)

The loss curves are written to `--out` (default: `stateful.png`). Exits with
status 1 if the two versions differ in a single bit or the loss did not fall.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import filterax as fx

MOMENTUM = 0.9
EPS = 1e-5
DROPOUT = 0.1
OPTIMISER = optax.adam(1e-2)


class Linear(fx.Module):
    """Acts on a batch: `x @ weight.T + bias`."""

    weight: jax.Array
    bias: jax.Array

    def __init__(self, in_size: int, out_size: int, *, key: jax.Array):
        limit = 1 / math.sqrt(in_size)
        self.weight = jax.random.uniform(
            key, (out_size, in_size), minval=-limit, maxval=limit
        )
        self.bias = jnp.zeros(out_size)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.weight.T + self.bias


class RunningNorm(fx.Module):
    """Normalises each feature; the running mean and variance live in Refs."""

    mean: jax.Ref
    var: jax.Ref

    def __init__(self, size: int):
        self.mean = jax.new_ref(jnp.zeros(size))
        self.var = jax.new_ref(jnp.ones(size))

    def __call__(self, h: jax.Array, *, training: bool) -> jax.Array:
        if training:
            mean, var = jnp.mean(h, axis=0), jnp.var(h, axis=0)
            # A write to a Ref in the forward pass: no gradient flows into it.
            self.mean[...] = MOMENTUM * self.mean[...] + (1 - MOMENTUM) * mean
            self.var[...] = MOMENTUM * self.var[...] + (1 - MOMENTUM) * var
        else:
            mean, var = self.mean[...], self.var[...]
        return (h - mean) / jnp.sqrt(var + EPS)


class Model(fx.Module):
    hidden: Linear
    norm: RunningNorm
    dropout: fx.nn.Dropout
    out: Linear
    stream: fx.RngStream

    def __init__(self, in_size: int, width: int, *, key: jax.Array):
        hidden_key, out_key, dropout_key = jax.random.split(key, 3)
        self.hidden = Linear(in_size, width, key=hidden_key)
        self.norm = RunningNorm(width)
        self.dropout = fx.nn.Dropout(DROPOUT)
        self.out = Linear(width, 1, key=out_key)
        self.stream = fx.RngStream(dropout_key)

    def __call__(self, x: jax.Array, *, training: bool = True) -> jax.Array:
        h = jax.nn.relu(self.norm(self.hidden(x), training=training))
        # Draws a key from the stream only in training.
        h = self.dropout(h, key=self.stream, inference=not training)
        return self.out(h)


def mean_squared_error(model: Model, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((model(x) - y) ** 2)


@fx.filter_jit
def train_step(model: Model, opt_state: optax.OptState, x: jax.Array, y: jax.Array):
    loss, grads = fx.filter_value_and_grad(mean_squared_error)(model, x, y)
    # grads.norm and grads.stream hold no arrays: Refs and keys are not trained.
    updates, opt_state = OPTIMISER.update(grads, opt_state)
    # The returned model holds the very Refs that went in, with their new values.
    return fx.apply_updates(model, updates), opt_state, loss


@fx.filter_jit
def evaluate(model: Model, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((model(x, training=False) - y) ** 2)


# --- The same, threaded by hand in plain JAX ----------------------------------


def plain_parameters(model: Model) -> dict[str, jax.Array]:
    return {
        "hidden_weight": model.hidden.weight,
        "hidden_bias": model.hidden.bias,
        "out_weight": model.out.weight,
        "out_bias": model.out.bias,
    }


def forward_by_hand(params, statistics, key, count, x, training):
    """Returns the prediction, the new statistics and the new counter."""
    h = x @ params["hidden_weight"].T + params["hidden_bias"]
    if training:
        mean, var = jnp.mean(h, axis=0), jnp.var(h, axis=0)
        statistics = {
            "mean": MOMENTUM * statistics["mean"] + (1 - MOMENTUM) * mean,
            "var": MOMENTUM * statistics["var"] + (1 - MOMENTUM) * var,
        }
    else:
        mean, var = statistics["mean"], statistics["var"]
    h = jax.nn.relu((h - mean) / jnp.sqrt(var + EPS))
    if training:
        dropout_key = jax.random.fold_in(key, count)
        count = count + 1
        keep = jax.random.bernoulli(dropout_key, 1 - DROPOUT, h.shape)
        h = jnp.where(keep, h / (1 - DROPOUT), 0.0)
    return h @ params["out_weight"].T + params["out_bias"], statistics, count


@jax.jit
def train_step_by_hand(params, opt_state, statistics, key, count, x, y):
    def loss_fn(params):
        prediction, new_statistics, new_count = forward_by_hand(
            params, statistics, key, count, x, training=True
        )
        return jnp.mean((prediction - y) ** 2), (new_statistics, new_count)

    (loss, (statistics, count)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params
    )
    updates, opt_state = OPTIMISER.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, statistics, count, loss


@jax.jit
def evaluate_by_hand(params, statistics, x, y):
    prediction, _, _ = forward_by_hand(params, statistics, None, None, x, False)
    return jnp.mean((prediction - y) ** 2)


# --- Data, plot, main -----------------------------------------------------------


def make_data(key: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
    """Inputs on very different scales, which the normalisation evens out."""
    x_key, noise_key = jax.random.split(key)
    x = jax.random.normal(x_key, (n, 3)) * jnp.array([1.0, 10.0, 0.1])
    y = jnp.sin(x[:, :1]) + 0.05 * x[:, 1:2] + 5.0 * x[:, 2:3]
    return x, y + 0.05 * jax.random.normal(noise_key, y.shape)


def plot_losses(history: dict[str, list[float]], every: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # write a file; never open a window
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7.5, 3.8))
    steps = np.arange(len(history["train"]))
    eval_steps = steps[::every]
    # One colour per quantity; filterax solid and wide, plain JAX dashed on top:
    # where the dashes run exactly along the solid line, the two agree.
    axes.plot(
        steps,
        history["train"],
        color="tab:blue",
        lw=2.5,
        alpha=0.5,
        label="train batch (filterax)",
    )
    axes.plot(
        steps,
        history["train by hand"],
        "--",
        color="tab:blue",
        lw=0.8,
        label="train batch (by hand)",
    )
    axes.plot(
        eval_steps,
        history["eval"],
        color="tab:red",
        lw=3,
        alpha=0.5,
        label="held-out set (filterax)",
    )
    axes.plot(
        eval_steps,
        history["eval by hand"],
        "--",
        color="darkred",
        lw=1,
        label="held-out set (by hand)",
    )
    axes.set_yscale("log")
    axes.set_xlabel("training step")
    axes.set_ylabel("mean squared error (log scale)")
    axes.set_title("stateful.py: filterax (solid) and plain JAX (dashed)")
    # Outside the axes, so that it covers no curve.
    axes.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def same_bits(a, b) -> bool:
    return all(
        np.asarray(x).tobytes() == np.asarray(y).tobytes()
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run for CI")
    parser.add_argument("--out", default="stateful.png", help="the plot")
    args = parser.parse_args(argv)
    steps, width = (60, 16) if args.small else (600, 64)
    every = max(1, steps // 10)

    model_key, train_key, eval_key, batch_key = jax.random.split(jax.random.key(0), 4)
    x_train, y_train = make_data(train_key, 2048)
    x_eval, y_eval = make_data(eval_key, 512)
    model = Model(3, width, key=model_key)
    print(model)
    # Refs and keys are not inexact arrays: the optimiser state has no room for them.
    opt_state = OPTIMISER.init(fx.filter(model, fx.is_inexact_array))

    params = plain_parameters(model)
    hand_opt_state = OPTIMISER.init(params)
    statistics = {"mean": model.norm.mean[...], "var": model.norm.var[...]}
    key, count = model.stream.key, model.stream.count[...]

    history: dict[str, list[float]] = {
        name: [] for name in ("train", "train by hand", "eval", "eval by hand")
    }
    train_losses, hand_losses = [], []
    print(f"{'step':>5}  {'loss':>10}  {'by hand':>10}  {'eval':>10}  {'by hand':>10}")
    start = time.perf_counter()
    for step in range(steps):
        index = jax.random.randint(jax.random.fold_in(batch_key, step), (64,), 0, 2048)
        x, y = x_train[index], y_train[index]
        model, opt_state, loss = train_step(model, opt_state, x, y)
        params, hand_opt_state, statistics, count, hand_loss = train_step_by_hand(
            params, hand_opt_state, statistics, key, count, x, y
        )
        train_losses.append(loss)
        hand_losses.append(hand_loss)
        history["train"].append(float(loss))
        history["train by hand"].append(float(hand_loss))
        if step % every == 0:
            history["eval"].append(float(evaluate(model, x_eval, y_eval)))
            history["eval by hand"].append(
                float(evaluate_by_hand(params, statistics, x_eval, y_eval))
            )
            print(
                f"{step:5d}  {history['train'][-1]:10.5f}  "
                f"{history['train by hand'][-1]:10.5f}  {history['eval'][-1]:10.5f}  "
                f"{history['eval by hand'][-1]:10.5f}"
            )
    print(f"{steps} steps of both versions in {time.perf_counter() - start:.2f}s")

    plot_losses(history, every, args.out)
    print(f"loss curves written to {args.out}")

    checks = {
        "losses": same_bits(train_losses, hand_losses),
        "parameters": same_bits(plain_parameters(model), params),
        "running statistics": same_bits(
            {"mean": model.norm.mean[...], "var": model.norm.var[...]}, statistics
        ),
        "dropout counter": same_bits(model.stream.count[...], count),
    }
    for name, same in checks.items():
        print(f"{name:>18} bit-identical: {same}")
    first, last = history["eval"][0], history["eval"][-1]
    if not all(checks.values()) or not last < 0.5 * first:
        print(f"FAILED (eval loss {first:.5f} -> {last:.5f})", file=sys.stderr)
        return 1
    print(f"OK: eval loss fell from {first:.5f} to {last:.5f}; the versions agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
