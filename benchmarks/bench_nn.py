"""A training step built from `filterax.nn` against the same step in raw JAX.

Two networks, each written twice with identical parameters:

- a small CNN for 8x8 greyscale images (`Conv2d`, `MaxPool2d`, `Linear`);
- a stack of two pre-norm transformer blocks (`LayerNorm`,
  `MultiheadAttention` with a causal mask, `MLP`).

The filterax version is a Module of `filterax.nn` layers acting on one example,
mapped over the batch with `jax.vmap`, stepped with `filter_jit` and
`filter_value_and_grad`. The raw version is a plain dict of arrays and batched
`jax.numpy`/`jax.lax` code, stepped with `jax.jit` and `jax.value_and_grad`.
A step is loss, gradient and an SGD update, and returns the new parameters and
the loss.

One process times both, interleaving the repeats so that drifts in machine load
hit both alike, and prints the minimum and median per-step time and their
ratio (filterax / raw), beside the FLOPs of each compiled step from XLA's
`cost_analysis()` (expected equal: `tests/nn/test_nn_flops.py` pins that and
the equality of losses and gradients). No assertion is made on the timings.

Run: `python benchmarks/bench_nn.py [--repeats R] [--steps S]`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import filterax as fx
from filterax import nn

LEARNING_RATE = 0.1
Params = dict[str, Any]

# --- A small CNN ----------------------------------------------------------------


def make_cnn(channels: int = 8, *, key: jax.Array) -> nn.Sequential:
    """(1, 8, 8) -> conv, relu, pool -> conv, relu, pool -> flatten -> (10,)."""
    keys = jax.random.split(key, 3)
    relu = nn.Lambda(jax.nn.relu)
    return nn.Sequential(
        [
            nn.Conv2d(1, channels, 3, padding=1, key=keys[0]),
            relu,
            nn.MaxPool2d(2, stride=2),
            nn.Conv2d(channels, 2 * channels, 3, padding=1, key=keys[1]),
            relu,
            nn.MaxPool2d(2, stride=2),
            nn.Lambda(jnp.ravel),
            nn.Linear(2 * channels * 2 * 2, 10, key=keys[2]),
        ]
    )


def cnn_params(model: nn.Sequential) -> Params:
    """The arrays of `make_cnn`'s model (or of its gradient) as a plain dict."""
    conv1, conv2, linear = model.layers[0], model.layers[3], model.layers[7]
    return {
        "conv1": {"weight": conv1.weight, "bias": conv1.bias},
        "conv2": {"weight": conv2.weight, "bias": conv2.bias},
        "linear": {"weight": linear.weight, "bias": linear.bias},
    }


def _raw_conv(x: jax.Array, layer: Params) -> jax.Array:
    out = jax.lax.conv_general_dilated(x, layer["weight"], (1, 1), ((1, 1), (1, 1)))
    return out + layer["bias"]  # bias of shape (channels, 1, 1)


def _raw_max_pool(x: jax.Array) -> jax.Array:
    return jax.lax.reduce_window(
        x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID"
    )


def raw_cnn(params: Params, images: jax.Array) -> jax.Array:
    """The CNN on a batch `(batch, 1, 8, 8)`: logits `(batch, 10)`."""
    x = _raw_max_pool(jax.nn.relu(_raw_conv(images, params["conv1"])))
    x = _raw_max_pool(jax.nn.relu(_raw_conv(x, params["conv2"])))
    x = x.reshape(x.shape[0], -1)
    return x @ params["linear"]["weight"].T + params["linear"]["bias"]


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    log_probabilities = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probabilities, labels[:, None], 1))


def cnn_loss(model: nn.Sequential, images: jax.Array, labels: jax.Array) -> jax.Array:
    return _cross_entropy(jax.vmap(model)(images), labels)


def raw_cnn_loss(params: Params, images: jax.Array, labels: jax.Array) -> jax.Array:
    return _cross_entropy(raw_cnn(params, images), labels)


def cnn_data(batch: int, *, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    image_key, label_key = jax.random.split(key)
    images = jax.random.uniform(image_key, (batch, 1, 8, 8))
    return images, jax.random.randint(label_key, (batch,), 0, 10)


# --- Two transformer blocks -----------------------------------------------------


class Block(fx.Module):
    """`x + attention(norm(x))`, then `x + mlp(norm(x))`, on one sequence."""

    attention_norm: nn.LayerNorm
    attention: nn.MultiheadAttention
    mlp_norm: nn.LayerNorm
    mlp: nn.MLP

    def __init__(self, size: int, num_heads: int, *, key: jax.Array):
        attention_key, mlp_key = jax.random.split(key)
        self.attention_norm = nn.LayerNorm(size)
        self.attention = nn.MultiheadAttention(num_heads, size, key=attention_key)
        self.mlp_norm = nn.LayerNorm(size)
        self.mlp = nn.MLP(
            size, size, 4 * size, depth=1, activation=jax.nn.gelu, key=mlp_key
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        causal = jnp.tril(jnp.ones((x.shape[0], x.shape[0]), dtype=bool))
        h = jax.vmap(self.attention_norm)(x)
        x = x + self.attention(h, h, h, causal)
        return x + jax.vmap(self.mlp)(jax.vmap(self.mlp_norm)(x))


class Transformer(fx.Module):
    blocks: tuple[Block, ...]

    def __call__(self, x: jax.Array) -> jax.Array:
        for block in self.blocks:
            x = block(x)
        return x


def make_transformer(
    size: int = 64, num_heads: int = 4, num_blocks: int = 2, *, key: jax.Array
) -> Transformer:
    keys = jax.random.split(key, num_blocks)
    return Transformer(tuple(Block(size, num_heads, key=k) for k in keys))


def transformer_params(model: Transformer) -> Params:
    """The arrays of `make_transformer`'s model (or of its gradient) as a dict."""

    def block_params(block: Block) -> Params:
        attention = block.attention
        hidden, out = block.mlp.layers
        return {
            "norm1": {
                "weight": block.attention_norm.weight,
                "bias": block.attention_norm.bias,
            },
            "query": attention.query_proj.weight,
            "key": attention.key_proj.weight,
            "value": attention.value_proj.weight,
            "output": attention.output_proj.weight,
            "norm2": {"weight": block.mlp_norm.weight, "bias": block.mlp_norm.bias},
            "hidden": {"weight": hidden.weight, "bias": hidden.bias},
            "out": {"weight": out.weight, "bias": out.bias},
        }

    return {"blocks": [block_params(block) for block in model.blocks]}


def _raw_layer_norm(x: jax.Array, norm: Params) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    variance = jnp.maximum(0.0, jnp.var(x, axis=-1, keepdims=True))
    return (x - mean) * jax.lax.rsqrt(variance + 1e-5) * norm["weight"] + norm["bias"]


def _raw_attention(x: jax.Array, block: Params, num_heads: int) -> jax.Array:
    batch, seq, size = x.shape

    def heads(weight: jax.Array) -> jax.Array:
        return (x @ weight.T).reshape(batch, seq, num_heads, -1)

    query, key, value = (
        heads(block["query"]),
        heads(block["key"]),
        heads(block["value"]),
    )
    query = query / jnp.sqrt(query.shape[-1]).astype(query.dtype)
    logits = jnp.einsum("bshd,bShd->bhsS", query, key)
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    logits = jnp.where(causal, logits, jnp.finfo(logits.dtype).min)
    weights = jax.nn.softmax(logits)
    attended = jnp.einsum("bhsS,bShd->bshd", weights, value).reshape(batch, seq, -1)
    return attended @ block["output"].T


def raw_transformer(params: Params, x: jax.Array, num_heads: int = 4) -> jax.Array:
    """The blocks on a batch `(batch, seq, size)`."""
    for block in params["blocks"]:
        x = x + _raw_attention(_raw_layer_norm(x, block["norm1"]), block, num_heads)
        h = _raw_layer_norm(x, block["norm2"])
        h = jax.nn.gelu(h @ block["hidden"]["weight"].T + block["hidden"]["bias"])
        x = x + h @ block["out"]["weight"].T + block["out"]["bias"]
    return x


def transformer_loss(model: Transformer, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def raw_transformer_loss(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((raw_transformer(params, x) - y) ** 2)


def transformer_data(
    batch: int, seq: int, size: int, *, key: jax.Array
) -> tuple[jax.Array, jax.Array]:
    x_key, y_key = jax.random.split(key)
    shape = (batch, seq, size)
    return jax.random.normal(x_key, shape), jax.random.normal(y_key, shape)


# --- The steps --------------------------------------------------------------------


def filterax_step(loss: Callable[..., jax.Array]) -> Callable[..., Any]:
    """`(model, *data) -> (model, loss)`: one SGD step, under `filter_jit`."""

    @fx.filter_jit
    def step(model: Any, *data: jax.Array) -> tuple[Any, jax.Array]:
        value, grads = fx.filter_value_and_grad(loss)(model, *data)
        updates = jax.tree.map(lambda g: -LEARNING_RATE * g, grads)
        return fx.apply_updates(model, updates), value

    return step


def raw_step(loss: Callable[..., jax.Array]) -> Callable[..., Any]:
    """`(params, *data) -> (params, loss)`: one SGD step, under `jax.jit`."""

    @jax.jit
    def step(params: Params, *data: jax.Array) -> tuple[Params, jax.Array]:
        value, grads = jax.value_and_grad(loss)(params, *data)
        return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads), value

    return step


def compiled_flops(step: Any, *args: Any) -> float:
    """The FLOPs of `step` compiled for `args`, as XLA counts them."""
    cost = step.lower(*args).compile().cost_analysis()
    if isinstance(cost, list):  # older JAX: one dict per computation
        cost = cost[0]
    return float(cost["flops"])


def bench(
    name: str,
    variants: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]],
    repeats: int,
    steps: int,
) -> None:
    for step, args in variants.values():  # compile, and warm up
        for _ in range(3):
            jax.block_until_ready(step(*args))
    times: dict[str, list[float]] = {label: [] for label in variants}
    for _ in range(repeats):
        for label, (step, args) in variants.items():
            # The same arguments every step: what is timed is the step itself,
            # dispatch included (the update is returned, then dropped).
            start = time.perf_counter()
            for _ in range(steps):
                jax.block_until_ready(step(*args))
            times[label].append((time.perf_counter() - start) / steps * 1e6)
    raw_label = "raw jax.jit"
    raw_min, raw_median = min(times[raw_label]), statistics.median(times[raw_label])
    print(name)
    for label, (step, args) in variants.items():
        low, mid = min(times[label]), statistics.median(times[label])
        flops = compiled_flops(step, *args)
        print(
            f"  {label:12s} min {low:8.1f} us  median {mid:8.1f} us   "
            f"ratio min {low / raw_min:4.2f}x  median {mid / raw_median:4.2f}x   "
            f"compiled FLOPs {flops:,.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--steps", type=int, default=20)
    options = parser.parse_args()
    print(f"jax {jax.__version__}, backend {jax.default_backend()}")
    model_key, data_key = jax.random.split(jax.random.key(0))

    cnn = make_cnn(key=model_key)
    images, labels = cnn_data(64, key=data_key)
    bench(
        "small CNN, batch 64 of (1, 8, 8)",
        {
            "raw jax.jit": (raw_step(raw_cnn_loss), (cnn_params(cnn), images, labels)),
            "filterax.nn": (filterax_step(cnn_loss), (cnn, images, labels)),
        },
        options.repeats,
        options.steps,
    )

    transformer = make_transformer(key=model_key)
    x, y = transformer_data(16, 32, 64, key=data_key)
    bench(
        "2 transformer blocks, batch 16 of (32, 64), 4 heads",
        {
            "raw jax.jit": (
                raw_step(raw_transformer_loss),
                (transformer_params(transformer), x, y),
            ),
            "filterax.nn": (filterax_step(transformer_loss), (transformer, x, y)),
        },
        options.repeats,
        options.steps,
    )


if __name__ == "__main__":
    main()
