"""A long training loop, with Python's garbage collector as a real program has it.

`bench_dispatch.py` reports the best of short rounds, which leaves out the
rare full collections of Python's garbage collector. Here the optax Adam step of
`bench_dispatch.py` (204 arrays) runs for many consecutive calls, `filter_jit`
(returning the new model and optimiser state as Modules) against `jax.jit` on a
flat list of the same arrays, and the mean cost per call is reported with the
time the collector spent per call, by generation (through `gc.callbacks`).

The returned Modules (306 of them, with their attribute dictionaries) are
objects the collector tracks. `filter_jit` pauses the collector while it
builds them, and the loop frees the previous step's before allocating again,
so neither side should start a collection: the per-generation counts show
whether that holds. The run is repeated after `gc.freeze()`, which moves every
object alive after setup (JAX's and the program's own) out of the collector's
reach.

Run: `python benchmarks/bench_training_loop.py [--calls C] [--arrays N]`. No
assertion is made on the timings.
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any

import jax
import jax.numpy as jnp
from bench_dispatch import FieldActivation, Step, adam_steps, make_layers


class CollectorClock:
    """Counts garbage collections and the time they take, by generation."""

    def __init__(self) -> None:
        self.counts = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = info["generation"]
        self.counts[generation] += 1
        self.seconds[generation] += time.perf_counter() - self._started

    def reset(self) -> None:
        self.counts = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]


def loops(n_arrays: int) -> dict[str, Step]:
    """Per side: the step, and the dictionary it keeps its latest outputs in."""
    model = FieldActivation(make_layers(n_arrays), jax.nn.relu)
    ours, floor = adam_steps(model, jnp.ones(4), jnp.zeros(4))
    return {"filter_jit, Modules": ours, "jax.jit, flat list": floor}


def run(
    steps: dict[str, Step],
    calls: int,
    clock: CollectorClock,
) -> None:
    for name, (step, outputs) in steps.items():
        clock.reset()
        start = time.perf_counter()
        for _ in range(calls):
            step()
        jax.block_until_ready(outputs)
        per_call = (time.perf_counter() - start) / calls * 1e6
        collections = ", ".join(
            f"gen{g} {clock.counts[g] / calls:.3f}/call {clock.seconds[g] / calls * 1e6:6.1f} us"
            for g in range(3)
        )
        print(f"  {name:20s} {per_call:8.1f} us/call   collector: {collections}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--arrays", type=int, default=204)
    options = parser.parse_args()
    steps = loops(options.arrays)
    for step, _ in steps.values():  # compile, and warm up
        for _ in range(5):
            step()
    clock = CollectorClock()
    gc.callbacks.append(clock)
    print(f"jax {jax.__version__}, {options.arrays} arrays, {options.calls} calls each")
    print(f"collector as usual ({len(gc.get_objects())} tracked objects):")
    run(steps, options.calls, clock)
    gc.collect()
    gc.freeze()
    print("after gc.freeze():")
    run(steps, options.calls, clock)
    gc.unfreeze()


if __name__ == "__main__":
    main()
