"""A small transformer trained with data and tensor parallelism on 8 devices.

The sharding is declared on the model, not next to the training loop: every
`filterax.nn` layer names the dimensions of its parameters (`logical_axes`),
and four rules map those names onto a 4 x 2 mesh of devices, `("data",
"model")`. The batch is split over `"data"` (data parallelism); attention heads,
the MLP's hidden units and the vocabulary over `"model"` (tensor parallelism,
Megatron style). `sharded_init` builds the model compiled, each device making
only its own blocks of each parameter. XLA's partitioner inserts the
communication; the training step is an ordinary `filter_jit` function, compiled
once (counted with `jax.monitoring`).

Training checkpoints every few steps with `filterax.checkpoint.Checkpointer`
(asynchronously; in a multi-host run each process writes only its own shards)
and "stops" part-way, as if preempted; a second run resumes from the latest
complete step, restoring onto an abstract template (shapes and shardings, no
arrays), and replays the steps after it with the same losses.

The task is synthetic: each sequence counts upwards modulo the vocabulary from a
random start, with a random stride, and the model learns to predict the next
token. A PNG (`--out`) shows how each parameter is laid out over the mesh:
every block of a parameter is coloured by the device that holds it, and a
block held by several devices (replicated over an axis of the mesh) is striped
with the colour of each; a key maps the colours to the devices.

The model and its optimiser state are built together, by one function run
with `sharded_init`: the state's arrays get their parameters' shardings, its
step counter is replicated, and the abstract template a restore needs is
`filter_eval_shape` of the same function, every sharding included.

On CPU the 8 devices are simulated; the first lines below must run before JAX
initialises its backends. On a machine with 8 accelerators, drop them.

    python examples/sharded_transformer.py            # about 20 s (2 CPU cores)
    python examples/sharded_transformer.py --small    # about 10 s (CI)
    python examples/sharded_transformer.py --explicit # `Explicit` mesh axes

With `--explicit` the mesh has `Explicit` axes: shardings are part of the
arrays' types, and the step runs under `jax.set_mesh`. The model is the same;
only the labels of the loss are one-hot, as JAX (0.10) cannot gather one label
per index under `vmap` from a batch split over such a mesh.

Exits with status 1 if the loss did not fall, the replayed steps' losses
differ, or the step compiled more than once.
"""

import jax

jax.config.update("jax_num_cpu_devices", 8)

import argparse  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from typing import Any  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import filterax as fx  # noqa: E402
import filterax.checkpoint  # noqa: E402

# Logical axis -> mesh axis. Unnamed dimensions ("in", "out", ...) stay whole.
RULES = {"heads": "model", "mlp": "model", "vocab": "model", "embed": None}


class Block(fx.Module):
    norm1: fx.nn.LayerNorm
    attention: fx.nn.MultiheadAttention
    norm2: fx.nn.LayerNorm
    mlp: fx.nn.MLP

    def __init__(self, width: int, heads: int, *, key: jax.Array):
        attention_key, mlp_key = jax.random.split(key)
        self.norm1 = fx.nn.LayerNorm(width)
        self.attention = fx.nn.MultiheadAttention(heads, width, key=attention_key)
        self.norm2 = fx.nn.LayerNorm(width)
        # Column-parallel up-projection, row-parallel down-projection.
        self.mlp = fx.nn.MLP(
            width,
            width,
            4 * width,
            depth=1,
            activation=jax.nn.gelu,
            key=mlp_key,
            axes={
                "first": {"weight": ("mlp", "embed"), "bias": ("mlp",)},
                "last": {"weight": ("embed", "mlp"), "bias": ("embed",)},
            },
        )

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        h = jax.vmap(self.norm1)(x)
        x = x + self.attention(h, h, h, mask=mask)
        return x + jax.vmap(self.mlp)(jax.vmap(self.norm2)(x))


class Transformer(fx.Module):
    embedding: fx.nn.Embedding
    positions: jax.Array = fx.field(axes=(None, "embed"))
    blocks: list[Block]
    readout: fx.nn.Linear

    def __init__(
        self,
        vocab: int,
        width: int,
        heads: int,
        depth: int,
        length: int,
        *,
        key: jax.Array,
    ):
        keys = jax.random.split(key, depth + 3)
        self.embedding = fx.nn.Embedding(vocab, width, key=keys[0])
        self.positions = 0.02 * jax.random.normal(keys[1], (length, width))
        self.blocks = [Block(width, heads, key=k) for k in keys[2:-1]]
        self.readout = fx.nn.Linear(
            width,
            vocab,
            key=keys[-1],
            axes={"weight": ("vocab", "embed"), "bias": ("vocab",)},
        )

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = jax.vmap(self.embedding)(tokens) + self.positions[: tokens.shape[0]]
        mask = jnp.tril(jnp.ones((tokens.shape[0],) * 2, bool))
        for block in self.blocks:
            x = block(x, mask)
        return jax.vmap(self.readout)(x)


def batch_at(step: int, vocab: int, batch: int, length: int, seed: int) -> np.ndarray:
    """The batch of training step `step`: a function of the step alone, so a run
    resumed from a checkpoint sees the same data as one that never stopped."""
    generator = np.random.default_rng((seed, step))
    start = generator.integers(0, vocab, (batch, 1))
    stride = generator.integers(1, 4, (batch, 1))
    return (start + stride * np.arange(length + 1)) % vocab


def layout_picture(model: Any, path: str) -> None:
    """Draws every 2-D parameter as a grid of its blocks, coloured by the
    device that holds each block."""
    import matplotlib

    matplotlib.use("Agg")  # write a file; never open a window
    import matplotlib.pyplot as plt

    named = [
        (jax.tree_util.keystr(p), leaf)
        for p, leaf in jax.tree_util.tree_leaves_with_path(model)
        if fx.is_array(leaf) and leaf.ndim == 2
    ]
    from matplotlib.patches import Patch

    columns = 4
    rows = -(-len(named) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.8 * rows))
    colours = plt.get_cmap("tab10")
    devices = sorted({device.id for _, leaf in named for device in leaf.devices()})
    for ax, (name, leaf) in zip(np.ravel(axes), named):
        # Each column drawn `len(devices)` pixels wide, so that a block held by
        # several devices (replicated) is striped with every holder's colour.
        stripes = len(devices)
        grid = np.zeros((leaf.shape[0], leaf.shape[1] * stripes))
        holders: dict[tuple, list[int]] = {}
        for shard in leaf.addressable_shards:
            rows_of, columns_of = shard.index
            holders.setdefault(
                (rows_of.indices(leaf.shape[0]), columns_of.indices(leaf.shape[1])), []
            ).append(shard.device.id)
        for ((r0, r1, _), (c0, c1, _)), ids in holders.items():
            width = (c1 - c0) * stripes
            for position, device in enumerate(sorted(ids)):
                start = c0 * stripes + position * width // len(ids)
                stop = c0 * stripes + (position + 1) * width // len(ids)
                grid[r0:r1, start:stop] = device
        ax.imshow(
            grid,
            cmap=colours,
            vmin=-0.5,
            vmax=9.5,
            aspect="auto",
            interpolation="nearest",
        )
        ax.set_title(f"{name}\n{leaf.sharding.spec}", fontsize=7)
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in np.ravel(axes)[len(named) :]:
        ax.axis("off")
    figure.suptitle(
        "Which devices hold each block (a block held by several devices is "
        "striped with each one's colour)"
    )
    figure.legend(
        handles=[
            Patch(color=colours(device), label=f"device {device}") for device in devices
        ],
        loc="lower center",
        ncol=len(devices),
        fontsize=8,
    )
    figure.tight_layout(rect=(0, 0.05, 1, 1))
    figure.savefig(path, dpi=80)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run for CI")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--explicit", action="store_true", help="a mesh with `Explicit` axes"
    )
    parser.add_argument("--out", default="sharded_transformer.png")
    parser.add_argument(
        "--checkpoints",
        default=None,
        help="the checkpoint directory (default: a new temporary one)",
    )
    args = parser.parse_args(argv)
    if args.checkpoints is None:
        args.checkpoints = tempfile.mkdtemp(prefix="sharded_transformer_")
    steps = args.steps or (30 if args.small else 300)
    vocab, width, heads, depth, length, batch = (
        (16, 32, 4, 1, 16, 16) if args.small else (32, 64, 4, 2, 32, 32)
    )

    compilations = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration_secs, **kwargs: (
            compilations.append(event)
            if event == "/jax/core/compile/backend_compile_duration"
            else None
        )
    )

    kind = AxisType.Explicit if args.explicit else AxisType.Auto
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind,) * 2)
    if args.explicit:
        # On `Explicit` axes, the traced code must know the mesh.
        jax.set_mesh(mesh)
    optimiser = optax.adam(3e-3)

    def make_train_state(key: jax.Array) -> tuple[Transformer, Any]:
        """The model and its optimiser state, built together: `sharded_init`
        gives the state the parameters' shardings (its counter replicated)."""
        model = Transformer(vocab, width, heads, depth, length, key=key)
        return model, optimiser.init(fx.filter(model, fx.is_array))

    init = fx.sharded_init(make_train_state, mesh, RULES)
    model, opt_state = init(jax.random.key(args.seed))
    for path, names in jax.tree_util.tree_leaves_with_path(
        fx.logical_axes(model), is_leaf=lambda x: isinstance(x, tuple)
    )[:6]:
        print(f"{jax.tree_util.keystr(path):42} {names}")

    # An ordinary `filter_jit` step: its outputs keep the layout of its inputs.
    @fx.filter_jit
    def step(model, opt_state, tokens):
        def loss_fn(model):
            logits = jax.vmap(model)(tokens[:, :-1])
            if args.explicit:
                labels = jax.nn.one_hot(tokens[:, 1:], vocab, dtype=logits.dtype)
                return optax.softmax_cross_entropy(logits, labels).mean()
            return optax.softmax_cross_entropy_with_integer_labels(
                logits, tokens[:, 1:]
            ).mean()

        loss, grads = fx.filter_value_and_grad(loss_fn)(model)
        updates, opt_state = optimiser.update(
            grads, opt_state, fx.filter(model, fx.is_array)
        )
        return loss, fx.apply_updates(model, updates), opt_state

    rows = NamedSharding(mesh, P("data"))

    def train(model, opt_state, first: int, last: int, checkpoints) -> tuple:
        for i in range(first, last):
            tokens = batch_at(i, vocab, batch, length, args.seed).astype(np.int32)
            tokens = jax.device_put(tokens, rows)
            before = len(compilations)
            loss, model, opt_state = step(model, opt_state, tokens)
            step_compilations.append(len(compilations) - before)
            losses[i] = float(loss)
            if i % max(steps // 10, 1) == 0 or i == steps - 1:
                print(f"step {i:4d}  loss {losses[i]:.4f}")
            if (i + 1) % every == 0:
                # Asynchronous: the next steps run while it writes. Each process
                # of a multi-host run writes only the shards it holds.
                checkpoints.save(i + 1, (model, opt_state))
        return model, opt_state

    every = max(steps // 6, 1)
    losses: dict[int, float] = {}
    step_compilations: list[int] = []  # per call of `step`
    with filterax.checkpoint.Checkpointer(args.checkpoints, keep=2) as checkpoints:
        # The first run "stops" half-way through (as if preempted)...
        halfway = steps // 2 + every // 2
        model, opt_state = train(model, opt_state, 0, halfway, checkpoints)
        checkpoints.wait()
    uninterrupted = dict(losses)

    # ... and a new run resumes from the latest complete step. It restores onto
    # an abstract template (shapes and shardings, no arrays): nothing is built
    # twice, and every array lands directly on its devices.
    with filterax.checkpoint.Checkpointer(args.checkpoints, keep=2) as checkpoints:
        resume_from = checkpoints.latest_step()
        assert resume_from is not None
        # The same function, evaluated abstractly: every leaf, the optimiser
        # state's included, keeps its sharding.
        like = fx.filter_eval_shape(init, jax.random.key(args.seed))
        model, opt_state = checkpoints.restore(like)
        print(f"--- resumed from step {resume_from} (saved: {checkpoints.steps()}) ---")
        model, opt_state = train(model, opt_state, resume_from, steps, checkpoints)
    losses_list = [losses[i] for i in range(steps)]
    replayed = [i for i in range(resume_from, halfway) if i in uninterrupted]
    same = all(uninterrupted[i] == losses[i] for i in replayed)
    print(f"steps {resume_from}-{halfway - 1} ran twice; equal losses: {same}")

    layout_picture(model, args.out)
    print(
        f"compilations of the step: {sum(step_compilations)}; layout written to {args.out}"
    )
    ok = same and losses_list[-1] < 0.8 * losses_list[0] and sum(step_compilations) == 1
    if not ok:
        print("FAILED: the loss did not fall enough, or the step recompiled")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
