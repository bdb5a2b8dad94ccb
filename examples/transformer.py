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
    python examples/transformer.py --precision bf16   # also in bfloat16
    python examples/transformer.py --precision f16    # also in float16

Mixed precision (`--precision`) is a wrapper, not a change to the model: the
parameters stay float32, `filterax.mixed_precision` casts them and the inputs
to bfloat16 or float16 for the forward and backward passes, and the logits come
back in float32 for the loss (the `LayerNorm`s compute their statistics in
float32 whatever they are given). The gradients come back float32, so the
optimiser is unchanged. float16 overflows above 65504, so its run scales the
loss with a `DynamicLossScale` and skips (leaves the model and optimiser state
as they were) any step whose gradients were not finite. With `--precision`
the model is trained twice from the same start, in float32 and in the chosen
precision, and the two runs' loss curves are plotted side by side.

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
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

import filterax as fx
from filterax import nn

TEXT_PATH = Path(__file__).resolve().parent / "data" / "tiny_text.txt"
BATCH_SIZE = 32
DROPOUT = 0.2


PRECISIONS = {
    "f32": fx.Precision(compute=jnp.float32),
    "bf16": fx.Precision(compute=jnp.bfloat16),
    "f16": fx.Precision(compute=jnp.float16),
}


def loss_scale_for(precision: str) -> fx.NoOpLossScale | fx.DynamicLossScale:
    """float16 needs its loss scaled (its gradients underflow and overflow);
    float32 and bfloat16 share float32's exponent range and need none."""
    return fx.DynamicLossScale() if precision == "f16" else fx.NoOpLossScale()


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
    model: CharTransformer,
    inputs: jax.Array,
    targets: jax.Array,
    streams: fx.RngStream,
    policy: fx.Precision,
) -> jax.Array:
    # The model computes in `policy.compute` and returns float32 logits; the
    # loss is taken in float32. `streams` holds one stream per sequence of the
    # batch: `filter_vmap` hands each sequence its own.
    forward = fx.mixed_precision(model, policy)
    logits = fx.filter_vmap(lambda x, s: forward(x, key=s))(inputs, streams)
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
    policy: fx.Precision,
    loss_scale: fx.NoOpLossScale | fx.DynamicLossScale,
) -> tuple[
    CharTransformer,
    optax.OptState,
    fx.NoOpLossScale | fx.DynamicLossScale,
    jax.Array,
    jax.Array,
]:
    # `context` and `policy` are static, part of the compiled function's key.
    # The stream's counter is a Ref: traced, and advanced in place. The loss
    # scale's scale and counter are arrays: a new scale never recompiles.
    inputs, targets = random_windows(key, data, context)
    # `split` draws one key from `stream` and makes a batch of streams. It is
    # called outside the differentiated function: JAX 0.10.2 cannot
    # differentiate a scan (the stacked blocks) that writes a Ref made inside
    # the function being differentiated.
    streams = stream.split(BATCH_SIZE)

    def scaled_loss(model: CharTransformer) -> tuple[jax.Array, jax.Array]:
        loss = loss_fn(model, inputs, targets, streams, policy)
        return loss_scale.scale(loss), loss

    (_, loss), grads = fx.filter_value_and_grad(scaled_loss, has_aux=True)(model)
    grads = loss_scale.unscale(grads)
    finite = fx.all_finite(grads)
    updates, new_opt_state = optimiser.update(grads, opt_state, fx.trainable(model))
    new_model = fx.apply_updates(model, updates)
    # A step whose gradients overflowed leaves the model and the optimiser
    # state as they were (with float32 and bfloat16 that never happens).
    model, opt_state = fx.select_tree(
        finite, (new_model, new_opt_state), (model, opt_state)
    )
    return model, opt_state, loss_scale.adjust(finite), loss, finite


@fx.filter_jit
def evaluate(
    model: CharTransformer,
    data: jax.Array,
    key: jax.Array,
    context: int,
    policy: fx.Precision,
) -> jax.Array:
    """The loss on random windows of `data`, without dropout, computed in the
    policy's precision."""
    inputs, targets = random_windows(key, data, context)
    logits = jax.vmap(fx.mixed_precision(nn.inference_mode(model), policy))(inputs)
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


class Run(NamedTuple):
    """What one training run gives: the trained model and its loss curves."""

    precision: str
    model: CharTransformer
    losses: list[float]
    eval_steps: list[int]
    validation: list[float]
    skipped: int  # steps whose gradients overflowed (float16 only)
    seconds: float


def train(
    precision: str,
    model: CharTransformer,
    data: tuple[jax.Array, jax.Array],
    steps: int,
    context: int,
    seed: int,
) -> Run:
    """Trains `model` for `steps` steps in `precision` (a key of `PRECISIONS`),
    printing the losses; every run of one seed sees the same batches."""
    train_data, validation_data = data
    _, data_key, stream_key, eval_key = jax.random.split(jax.random.key(seed), 4)
    stream = fx.RngStream(stream_key)
    policy, loss_scale = PRECISIONS[precision], loss_scale_for(precision)
    schedule = optax.warmup_cosine_decay_schedule(0.0, 3e-3, steps // 10, steps)
    optimiser = optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=1e-2)
    )
    opt_state = optimiser.init(fx.trainable(model))

    losses: list[float] = []
    eval_steps: list[int] = []
    validation: list[float] = []
    skipped = 0
    start = time.perf_counter()
    for step in range(steps):
        data_key, step_key = jax.random.split(data_key)
        model, opt_state, loss_scale, loss, finite = train_step(
            model,
            opt_state,
            optimiser,
            train_data,
            step_key,
            stream,
            context,
            policy,
            loss_scale,
        )
        losses.append(float(loss))
        skipped += not bool(finite)
        if step == 0:
            print(f"compiled the training step in {time.perf_counter() - start:.1f}s")
        if step % max(1, steps // 10) == 0 or step == steps - 1:
            validation.append(
                float(evaluate(model, validation_data, eval_key, context, policy))
            )
            eval_steps.append(step)
            print(
                f"[{precision}] step {step:5d}  training loss {losses[-1]:.3f}  "
                f"validation loss {validation[-1]:.3f}"
            )
    seconds = time.perf_counter() - start
    print(
        f"[{precision}] {steps} steps in {seconds:.2f}s; the stream drew "
        f"{int(stream.count[...])} keys; {skipped} step(s) skipped; final loss "
        f"scale {float(loss_scale.loss_scale):g}"
    )
    return Run(precision, model, losses, eval_steps, validation, skipped, seconds)


def plot_losses(runs: list[Run], path: str) -> None:
    """One panel per run, side by side on one scale: float32's first."""
    import matplotlib

    matplotlib.use("Agg")  # write a file; never open a window
    import matplotlib.pyplot as plt

    figure, panels = plt.subplots(
        1, len(runs), figsize=(5 * len(runs), 3.5), sharey=True, squeeze=False
    )
    for axes, run in zip(panels[0], runs):
        axes.plot(run.losses, label="training (with dropout)", alpha=0.7)
        axes.plot(run.eval_steps, run.validation, marker="o", label="validation")
        axes.set_xlabel("step")
        axes.set_title(f"transformer.py, {run.precision}")
        axes.legend()
    panels[0][0].set_ylabel("cross-entropy (nats per character)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def sizes(small: bool) -> tuple[int, int, int]:
    """`(num_blocks, size, context)`. The blocks are an `nn.Stacked`: compile
    time does not grow with their number, only the step time does."""
    return (2, 32, 32) if small else (2, 64, 64)


def load_text() -> tuple[list[str], jax.Array, jax.Array]:
    """The distinct characters, and the encoded text split 9:1 into training
    and validation data."""
    text = TEXT_PATH.read_text(encoding="utf-8")
    characters = sorted(set(text))
    index_of = {c: i for i, c in enumerate(characters)}
    encoded = jnp.array([index_of[c] for c in text], dtype=jnp.int32)
    split = int(0.9 * len(encoded))
    return characters, encoded[:split], encoded[split:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run for CI")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="transformer.png", help="the plot's path")
    parser.add_argument(
        "--precision",
        choices=sorted(PRECISIONS),
        default="f32",
        help="also train in this precision (bf16, f16) and plot it beside f32",
    )
    args = parser.parse_args(argv)
    steps = args.steps or (40 if args.small else 500)
    num_blocks, size, context = sizes(args.small)

    characters, train_data, validation_data = load_text()
    index_of = {c: i for i, c in enumerate(characters)}
    print(
        f"{len(train_data) + len(validation_data)} characters ({len(characters)} "
        f"distinct): {len(train_data)} for training, {len(validation_data)} for "
        "validation"
    )

    model = CharTransformer(
        len(characters),
        size,
        num_blocks,
        num_heads=4,
        dropout=DROPOUT,
        key=jax.random.split(jax.random.key(args.seed), 4)[0],
    )
    n_parameters = sum(leaf.size for leaf in jax.tree.leaves(fx.trainable(model)))
    print(f"a {num_blocks}-block transformer with {n_parameters} parameters")

    precisions = ["f32"] if args.precision == "f32" else ["f32", args.precision]
    data = (train_data, validation_data)
    runs = [train(p, model, data, steps, context, args.seed) for p in precisions]
    plot_losses(runs, args.out)
    print(f"loss curves written to {args.out}")

    trained = runs[-1].model
    print(f"samples from the {runs[-1].precision} run (temperature 0.8):")
    for i, prompt in enumerate(["Shall I ", "When in "]):
        tokens = sample(
            trained,
            [index_of[c] for c in prompt],
            100 if args.small else 300,
            context,
            i,
        )
        print("---")
        print("".join(characters[t] for t in tokens))
    print("---")

    uniform = math.log(len(characters))
    print(f"(a uniform guess scores {uniform:.3f} nats per character)")
    status = 0
    for run in runs:
        window = max(1, min(10, steps // 10))
        first = sum(run.losses[:window]) / window
        last = sum(run.losses[-window:]) / window
        if not last < 0.8 * first:
            print(
                f"FAILED [{run.precision}]: loss went from {first:.3f} to {last:.3f}",
                file=sys.stderr,
            )
            status = 1
        else:
            print(
                f"OK [{run.precision}]: training loss fell from {first:.3f} to {last:.3f}"
            )
    if len(runs) > 1:
        print(
            f"final validation loss: {runs[0].validation[-1]:.3f} (f32), "
            f"{runs[1].validation[-1]:.3f} ({runs[1].precision})"
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
