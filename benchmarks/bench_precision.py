"""Mixed precision on the transformer of `examples/transformer.py`: step time,
the memory of the compiled training step, and the final losses, in float32,
bfloat16 compute and float16 compute with a dynamic loss scale, side by side
in one process.

Each precision trains the same model from the same start on the same batches
with the example's own `train_step` (parameters and optimiser state float32,
`filterax.mixed_precision` around the model, `DynamicLossScale` and skipped
steps for float16). For each one this measures:

- saved activations: the bytes of the residuals that reverse mode keeps from
  the forward pass for the backward pass (the arrays held by the `vjp_fn` of
  `filter_vjp` of the example's loss, compiled): what any backend must store,
  before XLA's backend decides how to lay out the computation.
- compiled memory: XLA's analysis of the compiled training step
  (`train_step.lower(...).compile().memory_analysis()`): `temp`, the buffers
  the step allocates for itself (the activations and other temporaries, as
  this backend lays them out), and the arguments and outputs (parameters,
  optimiser state, data), which mixed precision leaves float32. These are
  deterministic counts, not a sampled peak: a CPU has no device memory
  statistics.
- step time: the compiled step, the precisions interleaved step by step, so
  that drifts in machine load hit them alike (minimum and median).
- losses: the mean training loss of the last tenth of the steps, and the
  validation loss at the end.

On a CPU half precision is not faster: XLA's CPU backend has no bfloat16 or
float16 matrix units and computes those products by converting to float32, so
the casts are extra work. On a GPU (tensor cores) or TPU the products
themselves run in half precision. No assertion is made on the timings.

Run: `python benchmarks/bench_precision.py [--small] [--steps N]`.

Measured on the project's shared, heavily loaded 2-core CPU machine (jax
0.10.2; no accelerator was available, so there are no GPU figures; the
example's full size: 2 blocks, width 64, context 64, batch 32; 100 steps):

| precision | saved activations MiB | vs f32 | compiled temp MiB | vs f32 | args+outs MiB | min ms | median ms | median vs f32 | compile s | final train loss | final val loss | skipped |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
| f32  | 54.17 | 1.00x | 63.60 | 1.00x | 2.48 | 40.9 | 71.3 | 1.00x | 26.4 | 2.304 | 2.278 | 0 |
| bf16 | 34.22 | 0.63x | 62.54 | 0.98x | 2.48 | 50.8 | 91.5 | 1.28x | 21.7 | 2.304 | 2.277 | 0 |
| f16  | 34.22 | 0.63x | 44.30 | 0.70x | 2.48 | 41.6 | 73.9 | 1.04x | 16.0 | 2.304 | 2.278 | 0 |

The activations kept for the backward pass fall by 37% in both half
precisions (not 50%: the normalisation statistics, the softmax and the loss
stay float32, and the attention mask is boolean). The compiled step's own
memory falls by 30% in float16, but only 2% in bfloat16: XLA's CPU backend
has no bfloat16 arithmetic and widens those operations to float32 inside the
step. The steps are no faster on a CPU (bfloat16 1.28x slower, float16 about
the same), as expected; the losses agree with float32's to three decimals,
and the float16 run skipped no step (its dynamic scale stayed at 2^15).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import jax

import filterax as fx

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "transformer.py"
PRECISIONS = ("f32", "bf16", "f16")


def load_example() -> ModuleType:
    """`examples/transformer.py`, imported as the module `transformer`."""
    spec = importlib.util.spec_from_file_location("transformer", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: its Modules are dataclasses, which look their
    # module up in `sys.modules`.
    sys.modules["transformer"] = module
    spec.loader.exec_module(module)
    return module


class Trainer:
    """One precision's training run, advanced one step at a time."""

    def __init__(self, example: ModuleType, precision: str, small: bool, steps: int):
        import optax  # noqa: PLC0415 - an extra of the examples, as in the example

        self.example, self.precision = example, precision
        num_blocks, size, self.context = example.sizes(small)
        characters, self.train_data, self.validation_data = example.load_text()
        model_key, self.data_key, stream_key, self.eval_key = jax.random.split(
            jax.random.key(0), 4
        )
        self.model = example.CharTransformer(
            len(characters), size, num_blocks, 4, example.DROPOUT, key=model_key
        )
        self.stream = fx.RngStream(stream_key)
        self.policy = example.PRECISIONS[precision]
        self.loss_scale = example.loss_scale_for(precision)
        schedule = optax.warmup_cosine_decay_schedule(0.0, 3e-3, steps // 10, steps)
        self.optimiser = optax.chain(
            optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=1e-2)
        )
        self.opt_state = self.optimiser.init(fx.trainable(self.model))
        self.losses: list[float] = []
        self.times: list[float] = []
        self.skipped = 0

    def arguments(self, key: jax.Array) -> tuple[Any, ...]:
        return (
            self.model,
            self.opt_state,
            self.optimiser,
            self.train_data,
            key,
            self.stream,
            self.context,
            self.policy,
            self.loss_scale,
        )

    def memory(self) -> dict[str, float]:
        """The compiled step's memory analysis, and the seconds that tracing,
        lowering and compiling it took."""
        start = time.perf_counter()
        lowered = self.example.train_step.lower(*self.arguments(self.data_key))
        analysis = lowered.compile().memory_analysis()
        return {
            "temp": analysis.temp_size_in_bytes,
            "arguments": analysis.argument_size_in_bytes,
            "outputs": analysis.output_size_in_bytes,
            "compile": time.perf_counter() - start,
        }

    def saved_activations(self) -> int:
        """The bytes of the arrays reverse mode keeps for the backward pass
        of the loss on one batch."""
        example = self.example
        inputs, targets = example.random_windows(
            self.data_key, self.train_data, self.context
        )
        # A stream of its own: the training run's keys are left untouched.
        streams = fx.RngStream(jax.random.key(1)).split(example.BATCH_SIZE)

        @fx.filter_jit
        def backward_pass(model: Any, policy: fx.Precision) -> Any:
            def loss(model: Any) -> Any:
                return example.loss_fn(model, inputs, targets, streams, policy)

            return fx.filter_vjp(loss, model)[1]

        residuals = jax.tree.leaves(backward_pass(self.model, self.policy))
        return sum(leaf.nbytes for leaf in residuals if fx.is_array(leaf))

    def step(self) -> None:
        self.data_key, key = jax.random.split(self.data_key)
        start = time.perf_counter()
        out = self.example.train_step(*self.arguments(key))
        self.model, self.opt_state, self.loss_scale, loss, finite = out
        loss = float(loss)  # waits for the step
        self.times.append(time.perf_counter() - start)
        self.losses.append(loss)
        self.skipped += not bool(finite)

    def validation_loss(self) -> float:
        return float(
            self.example.evaluate(
                self.model,
                self.validation_data,
                self.eval_key,
                self.context,
                self.policy,
            )
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--small", action="store_true", help="the example's --small")
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args(argv)
    example = load_example()
    trainers = {p: Trainer(example, p, args.small, args.steps) for p in PRECISIONS}
    print(
        f"jax {jax.__version__} on {jax.devices()[0].device_kind}; {args.steps} steps"
    )

    memory = {p: trainer.memory() for p, trainer in trainers.items()}
    saved = {p: trainer.saved_activations() for p, trainer in trainers.items()}
    for trainer in trainers.values():  # the first step, not timed: it compiles
        trainer.step()
    for _ in range(args.steps - 1):
        for trainer in trainers.values():
            trainer.step()

    tail = max(1, args.steps // 10)
    base = memory["f32"]["temp"]
    base_saved = saved["f32"]
    base_time = statistics.median(trainers["f32"].times[1:])
    rows = []
    for p, trainer in trainers.items():
        times = trainer.times[1:]
        rows.append(
            (
                p,
                f"{saved[p] / 2**20:.2f}",
                f"{saved[p] / base_saved:.2f}x",
                f"{memory[p]['temp'] / 2**20:.2f}",
                f"{memory[p]['temp'] / base:.2f}x",
                f"{(memory[p]['arguments'] + memory[p]['outputs']) / 2**20:.2f}",
                f"{1e3 * min(times):.1f}",
                f"{1e3 * statistics.median(times):.1f}",
                f"{statistics.median(times) / base_time:.2f}x",
                f"{memory[p]['compile']:.1f}",
                f"{statistics.mean(trainer.losses[-tail:]):.3f}",
                f"{trainer.validation_loss():.3f}",
                str(trainer.skipped),
            )
        )
    header = (
        "precision",
        "saved activations MiB",
        "saved vs f32",
        "compiled temp MiB",
        "temp vs f32",
        "args+outs MiB",
        "min ms",
        "median ms",
        "median vs f32",
        "compile s",
        "final train loss",
        "final val loss",
        "skipped",
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    for p in ("bf16", "f16"):
        print(
            f"{p}: the activations saved for the backward pass change by "
            f"{100 * (saved[p] / base_saved - 1):+.0f}% against f32; the compiled "
            f"step's temporary memory on {jax.devices()[0].platform} by "
            f"{100 * (memory[p]['temp'] / base - 1):+.0f}%."
        )


if __name__ == "__main__":
    main()
