"""Measures the memory/recomputation trade-off of a long while loop's gradient
and draws `docs/images/control-flow-tradeoff.svg`.

For a loop of `--steps` steps with a carry of `f32[1024]`, it compiles the
gradient for `kind="bounded"` and for `kind="checkpointed"` at several
`checkpoints`, reads the compiled temporary memory
(`.compile().memory_analysis().temp_size_in_bytes`, in carries), and counts
the body evaluations of one gradient with `jax.debug.callback` (on a small
carry, as the count does not depend on its size).

Run from the repository root: `python docs/scripts/control_flow_tradeoff.py`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import filterax as fx  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "images" / "control-flow-tradeoff.svg"
SIZE = 1024


def make_loss(steps: int, kind: str, evaluations: list | None = None, **options):
    def loss(w: jax.Array, x0: jax.Array) -> jax.Array:
        def body(state: tuple) -> tuple:
            x, i = state
            if evaluations is not None:
                jax.debug.callback(lambda: evaluations.append(None))
            return jnp.sin(x * w) + 0.1 * x, i + 1

        x, _ = fx.filter_while_loop(
            lambda s: s[1] < steps, body, (x0, jnp.array(0)), kind=kind, **options
        )
        return (x**2).sum()

    return loss


def temp_carries(steps: int, kind: str, **options) -> float:
    compiled = (
        jax.jit(jax.grad(make_loss(steps, kind, **options)))
        .lower(0.9, jnp.ones(SIZE))
        .compile()
    )
    return compiled.memory_analysis().temp_size_in_bytes / (4 * SIZE)


def evaluations_per_step(steps: int, kind: str, **options) -> float:
    evaluations: list = []
    loss = make_loss(steps, kind, evaluations, **options)
    jax.block_until_ready(jax.jit(jax.grad(loss))(0.9, jnp.ones(4)))
    return len(evaluations) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=OUT)
    options = parser.parse_args()
    steps = options.steps

    budgets = [2, 4, 8, 16, 32, 64]
    memory = [temp_carries(steps, "checkpointed", checkpoints=k) for k in budgets]
    work = [evaluations_per_step(steps, "checkpointed", checkpoints=k) for k in budgets]
    bounded_memory = temp_carries(steps, "bounded", max_steps=steps)
    bounded_work = evaluations_per_step(steps, "bounded", max_steps=steps)
    for k, m, w in zip(budgets, memory, work):
        print(f"checkpoints={k:3d}: {m:8.1f} carries, {w:6.2f} evaluations/step")
    print(
        f"bounded:        {bounded_memory:8.1f} carries, {bounded_work:6.2f} evaluations/step"
    )

    # A fixed hash salt and no date keep the SVG identical from run to run.
    plt.rcParams["svg.hashsalt"] = "filterax"
    figure, axis = plt.subplots(figsize=(6.4, 4.0))
    axis.plot(memory, work, "o-", color="tab:blue", label='kind="checkpointed"')
    for k, m, w in zip(budgets, memory, work):
        axis.annotate(
            f"{k}", (m, w), textcoords="offset points", xytext=(5, 4), fontsize=8
        )
    axis.plot(
        [bounded_memory], [bounded_work], "s", color="tab:red", label='kind="bounded"'
    )
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("compiled temporary memory of the gradient (carries)")
    axis.set_ylabel("body evaluations per step")
    axis.set_title(
        f"Gradient of a {steps:,}-step while loop (labels: checkpoints)", fontsize=10
    )
    axis.grid(True, which="both", alpha=0.3)
    axis.legend()
    figure.tight_layout()
    options.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(options.out, format="svg", metadata={"Date": None})
    print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
