"""A tiny character-level transformer language model.

The model reads a window of characters and predicts, at every position, the
next one. It is built from `filterax.nn` layers: an `Embedding` of the
characters, transformer blocks of `MultiheadAttention` (with a causal mask and
`RotaryPositionalEmbedding` applied to the query and key heads, which is how
the model knows where each character is), `LayerNorm`s and an `MLP`, and a
final `Linear` read-out. Each layer acts on one example; `jax.vmap` maps a
layer over the positions of a sequence, `filter_vmap` the model over a batch.

Dropout (on the attention weights and on each residual branch) draws its keys
from a `filterax.RngStream`, passed where Equinox takes a `key`: every call
takes a fresh key from the stream, so no key is split by hand. For sampling,
`nn.inference_mode` switches every dropout off.

The text is eleven of Shakespeare's Sonnets (1609, public domain), bundled in
`examples/data/tiny_text.txt` (see `examples/data/README.md`); the last tenth
is held out to report a validation loss. Seven kilobytes are little: after a
few hundred steps the validation loss stops falling while the training loss
goes on, as the model starts to learn the text by heart.

    python examples/transformer.py            # full run, 500 steps
    python examples/transformer.py --small    # 40 steps of a smaller model (CI)

The blocks are an `nn.Stacked`: they are built once under `filter_vmap` and
applied by a scan, so the training step is traced and compiled for one block
whatever the number of blocks. Measured on a shared 2-core CPU under heavy
load (jax 0.10.2): the full run took 2 min 27 s, 30 s of it compiling the
training step; `--small` took 43 s, 18 s of it compiling.

The training and validation losses are plotted to `--out` (default:
`transformer.png`); samples from the trained model are printed at the end.
Exits with status 1 if the training loss did not fall.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

import filterax as fx
from filterax import nn

TEXT_PATH = Path(__file__).resolve().parent / "data" / "tiny_text.txt"
BATCH_SIZE = 32
DROPOUT = 0.2


class Block(fx.Module):
    """A pre-norm transformer block: `x + attention(norm(x))`, then
    `x + mlp(norm(x))`, with dropout on both residual branches."""

    attention_norm: nn.LayerNorm
    attention: nn.MultiheadAttention
    rope: nn.RotaryPositionalEmbedding
    mlp_norm: nn.LayerNorm
    mlp: nn.MLP
    dropout: nn.Dropout

    def __init__(self, size: int, num_heads: int, dropout: float, *, key: jax.Array):
        attention_key, mlp_key = jax.random.split(key)
        self.attention_norm = nn.LayerNorm(size)
        self.attention = nn.MultiheadAttention(
            num_heads, size, dropout_p=dropout, key=attention_key
        )
        self.rope = nn.RotaryPositionalEmbedding(size // num_heads)
        self.mlp_norm = nn.LayerNorm(size)
        self.mlp = nn.MLP(
            size, size, 4 * size, depth=1, activation=jax.nn.gelu, key=mlp_key
        )
        self.dropout = nn.Dropout(dropout)

    def rotate(
        self, query: jax.Array, key: jax.Array, value: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Rotary embeddings on the query and key heads, shape
        `(seq_length, num_heads, head_size)`; the values are left alone."""
        per_head = jax.vmap(self.rope, in_axes=1, out_axes=1)
        return per_head(query), per_head(key), value

    def __call__(self, x: jax.Array, *, key: fx.RngStream | None = None) -> jax.Array:
        seq_length = x.shape[0]
        causal = jnp.tril(jnp.ones((seq_length, seq_length), dtype=bool))
        h = jax.vmap(self.attention_norm)(x)
        h = self.attention(h, h, h, causal, key=key, process_heads=self.rotate)
        x = x + self.dropout(h, key=key)
        h = jax.vmap(self.mlp)(jax.vmap(self.mlp_norm)(x))
        return x + self.dropout(h, key=key)


class CharTransformer(fx.Module):
    """Characters in, next-character logits out, for one sequence."""

    embedding: nn.Embedding
    blocks: nn.Stacked[Block]
    final_norm: nn.LayerNorm
    readout: nn.Linear

    def __init__(
        self,
        vocab_size: int,
        size: int,
        num_blocks: int,
        num_heads: int,
        dropout: float,
        *,
        key: jax.Array,
    ):
        embedding_key, readout_key, blocks_key = jax.random.split(key, 3)
        self.embedding = nn.Embedding(vocab_size, size, key=embedding_key)
        # One `Block` built per key under `filter_vmap`, arrays stacked: the
        # blocks are traced and compiled once, whatever `num_blocks` is.
        self.blocks = nn.Stacked(
            lambda block_key: Block(size, num_heads, dropout, key=block_key),
            num_blocks,
            key=blocks_key,
        )
        self.final_norm = nn.LayerNorm(size)
        self.readout = nn.Linear(size, vocab_size, key=readout_key)

    def __call__(
        self, tokens: jax.Array, *, key: fx.RngStream | None = None
    ) -> jax.Array:
        x = jax.vmap(self.embedding)(tokens)
        # The stream is shared: each block draws its own keys from it in turn.
        x = self.blocks(x, key=key)
        return jax.vmap(self.readout)(jax.vmap(self.final_norm)(x))


def loss_fn(
    model: CharTransformer, inputs: jax.Array, targets: jax.Array, streams: fx.RngStream
) -> jax.Array:
    # `streams` holds one stream per sequence of the batch: `filter_vmap`
    # hands each sequence its own.
    logits = fx.filter_vmap(lambda x, s: model(x, key=s))(inputs, streams)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def random_windows(
    key: jax.Array, data: jax.Array, context: int
) -> tuple[jax.Array, jax.Array]:
    """`BATCH_SIZE` random windows of `data`, and the same shifted by one."""
    starts = jax.random.randint(key, (BATCH_SIZE,), 0, len(data) - context)
    windows = jax.vmap(lambda s: jax.lax.dynamic_slice(data, (s,), (context + 1,)))(
        starts
    )
    return windows[:, :-1], windows[:, 1:]


@fx.filter_jit
def train_step(
    model: CharTransformer,
    opt_state: optax.OptState,
    optimiser: optax.GradientTransformation,
    data: jax.Array,
    key: jax.Array,
    stream: fx.RngStream,
    context: int,
) -> tuple[CharTransformer, optax.OptState, jax.Array]:
    # `context` is a Python int: static, part of the compiled function's key.
    # The stream's counter is a Ref: traced, and advanced in place.
    inputs, targets = random_windows(key, data, context)
    # `split` draws one key from `stream` and makes a batch of streams. It is
    # called outside the differentiated function: JAX 0.10.2 cannot
    # differentiate a scan (the stacked blocks) that writes a Ref made inside
    # the function being differentiated.
    streams = stream.split(BATCH_SIZE)
    loss, grads = fx.filter_value_and_grad(loss_fn)(model, inputs, targets, streams)
    updates, opt_state = optimiser.update(grads, opt_state, fx.trainable(model))
    model = fx.apply_updates(model, updates)
    return model, opt_state, loss


@fx.filter_jit
def evaluate(
    model: CharTransformer, data: jax.Array, key: jax.Array, context: int
) -> jax.Array:
    """The loss on random windows of `data`, without dropout."""
    inputs, targets = random_windows(key, data, context)
    logits = jax.vmap(nn.inference_mode(model))(inputs)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


@fx.filter_jit
def next_token(
    model: CharTransformer, window: jax.Array, position: jax.Array, key: jax.Array
) -> jax.Array:
    """Samples the character after `window[position]`. The causal mask means
    that whatever follows `position` in `window` (padding) is never seen."""
    logits = model(window)[position]
    return jax.random.categorical(key, logits / 0.8)


def sample(
    model: CharTransformer, prompt: list[int], length: int, context: int, seed: int
) -> list[int]:
    """`prompt` continued by `length` sampled characters; the model sees the
    last `context` characters at each step."""
    model = nn.inference_mode(model)
    tokens = list(prompt)
    key = jax.random.key(seed)
    for _ in range(length):
        window = np.zeros(context, np.int32)
        visible = tokens[-context:]
        window[: len(visible)] = visible
        key, step_key = jax.random.split(key)
        # The position is an array, so that every step reuses one compilation.
        position = jnp.asarray(len(visible) - 1)
        tokens.append(int(next_token(model, jnp.asarray(window), position, step_key)))
    return tokens


def plot_losses(
    losses: list[float], eval_steps: list[int], validation: list[float], path: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")  # write a file; never open a window
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(5, 3.5))
    axes.plot(losses, label="training (with dropout)", alpha=0.7)
    axes.plot(eval_steps, validation, marker="o", label="validation")
    axes.set_xlabel("step")
    axes.set_ylabel("cross-entropy (nats per character)")
    axes.set_title("transformer.py")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run for CI")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="transformer.png", help="the plot's path")
    args = parser.parse_args(argv)
    steps = args.steps or (40 if args.small else 500)
    # The blocks are an `nn.Stacked`: compile time does not grow with their
    # number, only the step time does.
    num_blocks, size, context = (2, 32, 32) if args.small else (2, 64, 64)

    text = TEXT_PATH.read_text(encoding="utf-8")
    characters = sorted(set(text))
    index_of = {c: i for i, c in enumerate(characters)}
    encoded = jnp.array([index_of[c] for c in text], dtype=jnp.int32)
    split = int(0.9 * len(encoded))
    train_data, validation_data = encoded[:split], encoded[split:]
    print(
        f"{len(text)} characters ({len(characters)} distinct): "
        f"{len(train_data)} for training, {len(validation_data)} for validation"
    )

    keys = jax.random.split(jax.random.key(args.seed), 4)
    model_key, data_key, stream_key, eval_key = keys
    model = CharTransformer(
        len(characters), size, num_blocks, num_heads=4, dropout=DROPOUT, key=model_key
    )
    stream = fx.RngStream(stream_key)
    n_parameters = sum(leaf.size for leaf in jax.tree.leaves(fx.trainable(model)))
    print(f"a {num_blocks}-block transformer with {n_parameters} parameters")

    schedule = optax.warmup_cosine_decay_schedule(0.0, 3e-3, steps // 10, steps)
    optimiser = optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=1e-2)
    )
    opt_state = optimiser.init(fx.trainable(model))

    losses: list[float] = []
    eval_steps: list[int] = []
    validation: list[float] = []
    start = time.perf_counter()
    for step in range(steps):
        data_key, step_key = jax.random.split(data_key)
        model, opt_state, loss = train_step(
            model, opt_state, optimiser, train_data, step_key, stream, context
        )
        losses.append(float(loss))
        if step == 0:
            print(f"compiled the training step in {time.perf_counter() - start:.1f}s")
        if step % max(1, steps // 10) == 0 or step == steps - 1:
            validation.append(
                float(evaluate(model, validation_data, eval_key, context))
            )
            eval_steps.append(step)
            print(
                f"step {step:5d}  training loss {losses[-1]:.3f}  "
                f"validation loss {validation[-1]:.3f}"
            )
    elapsed = time.perf_counter() - start
    print(
        f"{steps} steps in {elapsed:.2f}s; the stream drew {int(stream.count[...])} keys"
    )

    plot_losses(losses, eval_steps, validation, args.out)
    print(f"loss curves written to {args.out}")

    print("samples (temperature 0.8):")
    for i, prompt in enumerate(["Shall I ", "When in "]):
        tokens = sample(
            model, [index_of[c] for c in prompt], 100 if args.small else 300, context, i
        )
        print("---")
        print("".join(characters[t] for t in tokens))
    print("---")

    window = max(1, min(10, steps // 10))
    first = sum(losses[:window]) / window
    last = sum(losses[-window:]) / window
    uniform = math.log(len(characters))
    print(f"(a uniform guess scores {uniform:.3f} nats per character)")
    if not last < 0.8 * first:
        print(f"FAILED: loss went from {first:.3f} to {last:.3f}", file=sys.stderr)
        return 1
    print(f"OK: training loss fell from {first:.3f} to {last:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
