"""Classify handwritten digits with a small convolutional network.

The data are the 1,797 8x8 greyscale digits that scikit-learn ships inside its
package (`sklearn.datasets.load_digits`: nothing is downloaded), split into a
training and a test set. The model is built from `filterax.nn` layers,
`Conv2d`, `MaxPool2d` and `Linear`, composed with `nn.Sequential`; activations
and the flattening step are plain functions wrapped in `nn.Lambda`. It is
trained with `filter_jit`, `filter_value_and_grad` and optax.

Every layer acts on one example (a `(channels, height, width)` image for the
convolutions): `jax.vmap` maps the model over a batch.

    python examples/cnn_digits.py            # full run: about 98% test accuracy
    python examples/cnn_digits.py --small    # a few seconds (used by CI)

The training loss and the test accuracy after each epoch are plotted to `--out`
(default: `cnn_digits.png`). The full run exits with status 1 if the test
accuracy is below 95%; the small run, if the loss did not fall.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import filterax as fx
from filterax import nn

BATCH_SIZE = 64
TARGET_ACCURACY = 0.95


def load_data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits as `(n, 1, 8, 8)` images in [0, 1] and integer labels,
    shuffled and split 80/20 into training and test sets."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    labels = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(labels))
    images, labels = images[order], labels[order]
    n_train = int(0.8 * len(labels))
    return images[:n_train], labels[:n_train], images[n_train:], labels[n_train:]


def make_model(channels: int, *, key: jax.Array) -> nn.Sequential:
    """Two convolution + pooling stages and a two-layer classifier head.

    Shapes for one example: (1, 8, 8) -> (c, 8, 8) -> (c, 4, 4)
    -> (2c, 4, 4) -> (2c, 2, 2) -> (8c,) -> (64,) -> (10,).
    """
    keys = jax.random.split(key, 4)
    relu = nn.Lambda(jax.nn.relu)
    return nn.Sequential(
        [
            nn.Conv2d(1, channels, kernel_size=3, padding=1, key=keys[0]),
            relu,
            nn.MaxPool2d(kernel_size=2, stride=2),
            nn.Conv2d(channels, 2 * channels, kernel_size=3, padding=1, key=keys[1]),
            relu,
            nn.MaxPool2d(kernel_size=2, stride=2),
            nn.Lambda(jnp.ravel),
            nn.Linear(2 * channels * 2 * 2, 64, key=keys[2]),
            relu,
            nn.Linear(64, 10, key=keys[3]),
        ]
    )


def loss_fn(model: nn.Sequential, images: jax.Array, labels: jax.Array) -> jax.Array:
    logits = jax.vmap(model)(images)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


@fx.filter_jit
def train_step(
    model: nn.Sequential,
    opt_state: optax.OptState,
    optimiser: optax.GradientTransformation,
    images: jax.Array,
    labels: jax.Array,
) -> tuple[nn.Sequential, optax.OptState, jax.Array]:
    # The model's arrays, the optimiser state and the batch are traced; the
    # activations, `jnp.ravel` and the optimiser's functions are static.
    loss, grads = fx.filter_value_and_grad(loss_fn)(model, images, labels)
    updates, opt_state = optimiser.update(grads, opt_state, fx.trainable(model))
    model = fx.apply_updates(model, updates)
    return model, opt_state, loss


@fx.filter_jit
def accuracy(model: nn.Sequential, images: jax.Array, labels: jax.Array) -> jax.Array:
    predictions = jnp.argmax(jax.vmap(model)(images), axis=-1)
    return jnp.mean(predictions == labels)


def plot_history(
    losses: list[float], epoch_ends: list[int], accuracies: list[float], path: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")  # write a file; never open a window
    import matplotlib.pyplot as plt

    figure, (loss_axes, accuracy_axes) = plt.subplots(1, 2, figsize=(9, 3.5))
    loss_axes.plot(losses)
    loss_axes.set_yscale("log")
    loss_axes.set_xlabel("step")
    loss_axes.set_ylabel("training cross-entropy")
    accuracy_axes.plot(epoch_ends, accuracies, marker="o")
    accuracy_axes.set_xlabel("step")
    accuracy_axes.set_ylabel("test accuracy")
    figure.suptitle("cnn_digits.py")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run for CI")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="cnn_digits.png", help="the plot's path")
    args = parser.parse_args(argv)
    epochs = args.epochs or (4 if args.small else 30)
    channels = 8 if args.small else 16

    x_train, y_train, x_test, y_test = load_data(args.seed)
    print(f"{len(y_train)} training and {len(y_test)} test images of shape (1, 8, 8)")
    model_key, shuffle_key = jax.random.split(jax.random.key(args.seed))
    model = make_model(channels, key=model_key)
    n_parameters = sum(leaf.size for leaf in jax.tree.leaves(fx.trainable(model)))
    print(f"a CNN with {n_parameters} parameters")

    steps_per_epoch = len(y_train) // BATCH_SIZE
    # The learning rate decays to zero over the run, so that the last epochs
    # settle rather than jump around.
    schedule = optax.cosine_decay_schedule(3e-3, epochs * steps_per_epoch)
    optimiser = optax.adamw(schedule, weight_decay=1e-4)
    opt_state = optimiser.init(fx.trainable(model))

    losses: list[float] = []
    epoch_ends: list[int] = []
    accuracies: list[float] = []
    start = time.perf_counter()
    for epoch in range(epochs):
        shuffle_key, epoch_key = jax.random.split(shuffle_key)
        order = np.asarray(jax.random.permutation(epoch_key, len(y_train)))
        for step in range(steps_per_epoch):
            batch = order[step * BATCH_SIZE : (step + 1) * BATCH_SIZE]
            model, opt_state, loss = train_step(
                model, opt_state, optimiser, x_train[batch], y_train[batch]
            )
            losses.append(float(loss))
        epoch_ends.append(len(losses))
        accuracies.append(float(accuracy(model, x_test, y_test)))
        epoch_loss = np.mean(losses[-steps_per_epoch:])
        print(
            f"epoch {epoch + 1:3d}/{epochs}  training loss {epoch_loss:.4f}  "
            f"test accuracy {accuracies[-1]:.2%}"
        )
    elapsed = time.perf_counter() - start
    print(f"{len(losses)} steps in {elapsed:.2f}s")

    plot_history(losses, epoch_ends, accuracies, args.out)
    print(f"loss and accuracy curves written to {args.out}")

    print(f"test accuracy: {accuracies[-1]:.2%} on {len(y_test)} images")
    if args.small:
        window = max(1, min(10, len(losses) // 10))
        first, last = np.mean(losses[:window]), np.mean(losses[-window:])
        if not last < 0.7 * first:
            print(f"FAILED: loss went from {first:.4f} to {last:.4f}", file=sys.stderr)
            return 1
        print(f"OK: loss fell from {first:.4f} to {last:.4f}")
    elif accuracies[-1] < TARGET_ACCURACY:
        print(f"FAILED: test accuracy below {TARGET_ACCURACY:.0%}", file=sys.stderr)
        return 1
    else:
        print(f"OK: test accuracy above {TARGET_ACCURACY:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
