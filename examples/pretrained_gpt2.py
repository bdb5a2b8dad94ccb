"""A GPT-2-style language model loading published weights by key path.

Published models come as safetensors files whose names and layouts are their
authors' (here GPT-2's: `wte.weight`, `h.0.attn.c_attn.weight`, ...). The
model below is written with `filterax.nn` and names its parts as filterax code
would (`blocks.0.attention.qkv.weight`); `filterax.safetensors.load` maps one
onto the other with `rename` rules, regexes applied in order to every name in
the file.

Names are not the only difference. GPT-2's projections are "Conv1D" layers
that store their weight as `(in, out)` and compute `x @ weight`, where
`nn.Linear` stores `(out, in)`. The load goes through a `like` in the file's
layout: the model's shapes from `filter_eval_shape`, the four projection
weights of each block transposed with `tree_at`; once loaded, the same
`tree_at` transposes those arrays back. The query, key and value projections
are one fused `(d, 3 d)` tensor in GPT-2, `c_attn`; the model keeps them fused
too (one `nn.Linear` whose output is split in three), so no tensor needs to be
cut.

Nothing can be downloaded here: the example first writes a file under the
names and shapes of the published `gpt2` checkpoint (random values, in GPT-2's
layout), then loads it and greedily generates a few tokens (token ids: there is
no tokenizer). With real weights, point `--weights` at the published
`model.safetensors`.

    python examples/pretrained_gpt2.py            # GPT-2 small's shapes (124M parameters)
    python examples/pretrained_gpt2.py --small    # a tiny model of the same layout (CI)

Exits with status 1 if the loaded parameters differ from the file's.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy

import filterax as fx
import filterax.safetensors
from filterax import nn


@dataclasses.dataclass(frozen=True)
class Config:
    vocab_size: int
    context: int  # the most positions the model has embeddings for
    size: int
    num_blocks: int
    num_heads: int


GPT2_SMALL = Config(
    vocab_size=50257, context=1024, size=768, num_blocks=12, num_heads=12
)
TINY = Config(vocab_size=96, context=64, size=32, num_blocks=2, num_heads=4)


class Attention(fx.Module):
    """Causal multi-head self-attention, with the query, key and value
    projections fused in one `Linear` (as GPT-2 has them)."""

    qkv: nn.Linear
    out: nn.Linear
    num_heads: int = fx.field(static=True)

    def __init__(self, size: int, num_heads: int, *, key: jax.Array):
        qkv_key, out_key = jax.random.split(key)
        self.qkv = nn.Linear(size, 3 * size, key=qkv_key)
        self.out = nn.Linear(size, size, key=out_key)
        self.num_heads = num_heads

    def __call__(self, x: jax.Array) -> jax.Array:
        length, size = x.shape
        head_size = size // self.num_heads
        query, key, value = jnp.split(jax.vmap(self.qkv)(x), 3, axis=-1)

        def heads(t: jax.Array) -> jax.Array:  # (length, size) -> (heads, length, head)
            return t.reshape(length, self.num_heads, head_size).transpose(1, 0, 2)

        scores = heads(query) @ heads(key).transpose(0, 2, 1) / math.sqrt(head_size)
        causal = jnp.tril(jnp.ones((length, length), dtype=bool))
        weights = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
        mixed = (weights @ heads(value)).transpose(1, 0, 2).reshape(length, size)
        return jax.vmap(self.out)(mixed)


class MLP(fx.Module):
    up: nn.Linear
    down: nn.Linear

    def __init__(self, size: int, *, key: jax.Array):
        up_key, down_key = jax.random.split(key)
        self.up = nn.Linear(size, 4 * size, key=up_key)
        self.down = nn.Linear(4 * size, size, key=down_key)

    def __call__(self, x: jax.Array) -> jax.Array:
        # GPT-2's GELU is the tanh approximation.
        return self.down(jax.nn.gelu(self.up(x), approximate=True))


class Block(fx.Module):
    """A pre-norm transformer block."""

    attention_norm: nn.LayerNorm
    attention: Attention
    mlp_norm: nn.LayerNorm
    mlp: MLP

    def __init__(self, size: int, num_heads: int, *, key: jax.Array):
        attention_key, mlp_key = jax.random.split(key)
        self.attention_norm = nn.LayerNorm(size)
        self.attention = Attention(size, num_heads, key=attention_key)
        self.mlp_norm = nn.LayerNorm(size)
        self.mlp = MLP(size, key=mlp_key)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attention(jax.vmap(self.attention_norm)(x))
        return x + jax.vmap(self.mlp)(jax.vmap(self.mlp_norm)(x))


class GPT2(fx.Module):
    """Token ids in, next-token logits out at every position. The read-out
    shares the token embedding's weight, as in GPT-2."""

    tokens: nn.Embedding
    positions: nn.Embedding
    blocks: list[Block]
    final_norm: nn.LayerNorm

    def __init__(self, config: Config, *, key: jax.Array):
        token_key, position_key, *block_keys = jax.random.split(
            key, 2 + config.num_blocks
        )
        self.tokens = nn.Embedding(config.vocab_size, config.size, key=token_key)
        self.positions = nn.Embedding(config.context, config.size, key=position_key)
        self.blocks = [Block(config.size, config.num_heads, key=k) for k in block_keys]
        self.final_norm = nn.LayerNorm(config.size)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.tokens.weight[tokens] + self.positions.weight[: len(tokens)]
        for block in self.blocks:
            x = block(x)
        return jax.vmap(self.final_norm)(x) @ self.tokens.weight.T


# GPT-2's names to the model's key paths. Some exports prefix every name with
# `transformer.`; the first rule drops it where it is.
GPT2_NAMES = [
    (r"^transformer\.", ""),
    (r"^wte\.", "tokens."),
    (r"^wpe\.", "positions."),
    (r"^h\.(\d+)\.", r"blocks.\1."),
    (r"\.ln_1\.", ".attention_norm."),
    (r"\.ln_2\.", ".mlp_norm."),
    (r"\.attn\.c_attn\.", ".attention.qkv."),
    (r"\.attn\.c_proj\.", ".attention.out."),
    (r"\.mlp\.c_fc\.", ".mlp.up."),
    (r"\.mlp\.c_proj\.", ".mlp.down."),
    (r"^ln_f\.", "final_norm."),
]


def conv1d_weights(model: GPT2) -> list[Any]:
    """The weights GPT-2 stores transposed (its Conv1D layers: `(in, out)`)."""
    return [
        weight
        for block in model.blocks
        for weight in (
            block.attention.qkv.weight,
            block.attention.out.weight,
            block.mlp.up.weight,
            block.mlp.down.weight,
        )
    ]


def _transposed(struct: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    """The struct of a 2-d array's transpose, its sharding transposed too."""
    sharding = struct.sharding
    if isinstance(sharding, jax.sharding.NamedSharding):
        spec = tuple(sharding.spec) + (None,) * (2 - len(sharding.spec))
        sharding = sharding.update(spec=jax.sharding.PartitionSpec(*spec[::-1]))
    return jax.ShapeDtypeStruct(struct.shape[::-1], struct.dtype, sharding=sharding)


def load_gpt2(path: str, like: GPT2) -> GPT2:
    """The model `like` (abstract, from `filter_eval_shape`, with shardings or
    not) with its parameters read from GPT-2's file at `path`."""
    in_file_layout = fx.tree_at(conv1d_weights, like, replace_fn=_transposed)
    loaded = fx.safetensors.load(path, in_file_layout, rename=GPT2_NAMES)
    return fx.tree_at(conv1d_weights, loaded, replace_fn=jnp.transpose)


def gpt2_tensors(config: Config, seed: int, prefix: str = "") -> dict[str, np.ndarray]:
    """Random tensors under the names and shapes (and Conv1D layout) of GPT-2's
    published checkpoint."""
    generator = np.random.default_rng(seed)
    d = config.size

    def normal(*shape: int) -> np.ndarray:
        return (0.02 * generator.standard_normal(shape)).astype(np.float32)

    tensors = {
        "wte.weight": normal(config.vocab_size, d),
        "wpe.weight": normal(config.context, d),
    }
    for i in range(config.num_blocks):
        for norm in ("ln_1", "ln_2"):
            tensors[f"h.{i}.{norm}.weight"] = 1 + normal(d)
            tensors[f"h.{i}.{norm}.bias"] = normal(d)
        for name, (rows, columns) in {
            "attn.c_attn": (d, 3 * d),
            "attn.c_proj": (d, d),
            "mlp.c_fc": (d, 4 * d),
            "mlp.c_proj": (4 * d, d),
        }.items():
            tensors[f"h.{i}.{name}.weight"] = normal(rows, columns)
            tensors[f"h.{i}.{name}.bias"] = normal(columns)
    tensors["ln_f.weight"] = 1 + normal(d)
    tensors["ln_f.bias"] = normal(d)
    return {prefix + name: value for name, value in tensors.items()}


@fx.filter_jit
def next_token(model: GPT2, window: jax.Array, position: jax.Array) -> jax.Array:
    """The most likely token after `window[position]`. The window has a fixed
    length (one compilation); the causal mask hides what follows `position`."""
    return jnp.argmax(model(window)[position])


def generate(model: GPT2, prompt: Sequence[int], steps: int) -> list[int]:
    window = (
        jnp.zeros(len(prompt) + steps, jnp.int32)
        .at[: len(prompt)]
        .set(jnp.array(prompt))
    )
    for position in range(len(prompt) - 1, len(prompt) - 1 + steps):
        token = next_token(model, window, jnp.asarray(position))
        window = window.at[position + 1].set(token)
    return [int(t) for t in window]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="a tiny model (CI)")
    parser.add_argument("--weights", help="a GPT-2 model.safetensors to load instead")
    parser.add_argument("--steps", type=int, default=8, help="tokens to generate")
    args = parser.parse_args(argv)
    config = TINY if args.small else GPT2_SMALL

    with tempfile.TemporaryDirectory() as directory:
        path = args.weights
        if path is None:
            path = os.path.join(directory, "model.safetensors")
            safetensors.numpy.save_file(gpt2_tensors(config, seed=0), path)
            print(
                f"wrote {os.path.getsize(path) / 2**20:.1f} MiB of GPT-2-shaped weights"
            )
        start = time.perf_counter()
        like = fx.filter_eval_shape(GPT2, config, key=jax.random.key(0))
        model = load_gpt2(path, like)
        count = sum(x.size for x in jax.tree.leaves(fx.filter(model, fx.is_array)))
        print(f"loaded {count:,} parameters in {time.perf_counter() - start:.1f}s")

        with safetensors.safe_open(path, framework="numpy") as file:
            names = set(file.keys())
            prefix = "transformer." if "transformer.wte.weight" in names else ""
            c_attn = file.get_tensor(f"{prefix}h.0.attn.c_attn.weight")
            ln_f = file.get_tensor(f"{prefix}ln_f.bias")
        if not (
            np.array_equal(np.asarray(model.blocks[0].attention.qkv.weight), c_attn.T)
            and np.array_equal(np.asarray(model.final_norm.bias), ln_f)
        ):
            print("the loaded parameters differ from the file's", file=sys.stderr)
            return 1

    prompt = [464, 2068, 7586] if config.vocab_size > 8000 else [1, 2, 3]
    tokens = generate(model, prompt, args.steps)
    print(f"prompt {prompt} -> greedy continuation {tokens[len(prompt) :]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
