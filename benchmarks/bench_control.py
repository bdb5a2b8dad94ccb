"""What filtered control flow costs against the `lax` primitives, and what
`filter_while_loop(kind="checkpointed")` saves.

One process measures, and prints side by side:

1. Forward `filter_scan` against `jax.lax.scan` on the same arrays: the number
   of jaxpr equations (equal: the forward pass is the same program), and the
   per-call time of the jitted scan (`filter_jit` against `jax.jit`; the scan
   is short, so dispatch dominates).
2. The gradient of a 10,000-step while loop: compiled temporary memory in
   carries for `kind="bounded"` against `kind="checkpointed"` with 16
   checkpoints (target: under 32 carries), and the body evaluations per step of
   the checkpointed gradient (forward pass, recomputation, one per step for
   its VJP), counted with `jax.debug.callback`.
3. Compile time of "scan over layers" (layers stacked by `filter_vmap` of a
   constructor) at depth 4 against depth 64 (target: within 1.5x).

Timings are interleaved repeats, reported as the minimum and the median with
their ratios. No assertion is made on them.

Run: `python benchmarks/bench_control.py [--repeats R] [--calls C]`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

import filterax as fx


def per_call_us(call: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        call()
    jax.block_until_ready(call())
    return (time.perf_counter() - start) / (calls + 1) * 1e6


def report(title: str, samples: dict[str, list[float]], unit: str) -> None:
    print(title)
    floor_name = next(iter(samples))
    floor_min = min(samples[floor_name])
    floor_median = statistics.median(samples[floor_name])
    for name, values in samples.items():
        low, mid = min(values), statistics.median(values)
        print(
            f"  {name:28s} min {low:9.2f} {unit}  median {mid:9.2f} {unit}   "
            f"ratio min {low / floor_min:4.2f}x  median {mid / floor_median:4.2f}x"
        )


# --- 1. Forward scan ---------------------------------------------------------------


def scan_step(carry: jax.Array, x: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    carry = jnp.tanh(carry * x["w"] + x["b"])
    return carry, carry.sum()


def bench_scan(repeats: int, calls: int) -> None:
    xs = {"w": jnp.ones((16, 8)), "b": jnp.zeros((16, 8))}
    init = jnp.ones(8)

    def ours(init: jax.Array, xs: dict) -> tuple:
        return fx.filter_scan(scan_step, init, xs)

    def theirs(init: jax.Array, xs: dict) -> tuple:
        return jax.lax.scan(scan_step, init, xs)

    ours_eqns = len(jax.make_jaxpr(ours)(init, xs).jaxpr.eqns)
    theirs_eqns = len(jax.make_jaxpr(theirs)(init, xs).jaxpr.eqns)
    same = str(jax.make_jaxpr(ours)(init, xs)) == str(jax.make_jaxpr(theirs)(init, xs))
    print(
        f"1. forward scan: jaxpr equations filter_scan {ours_eqns}, lax.scan "
        f"{theirs_eqns}; identical jaxprs: {same}"
    )
    jitted_ours, jitted_theirs = fx.filter_jit(ours), jax.jit(theirs)
    variants: dict[str, Callable[[], object]] = {
        "jax.jit(lax.scan)": lambda: jitted_theirs(init, xs),
        "filter_jit(filter_scan)": lambda: jitted_ours(init, xs),
    }
    for call in variants.values():
        for _ in range(3):
            jax.block_until_ready(call())
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, call in variants.items():
            times[name].append(per_call_us(call, calls))
    report("   per-call time of the jitted scan", times, "us")


# --- 2. Gradient of a long while loop --------------------------------------------


def loop_loss(
    steps: int, kind: str, callback: Callable[[], None] | None = None, **options
):
    def loss(w: jax.Array, x0: jax.Array) -> jax.Array:
        def body(state: tuple) -> tuple:
            x, i = state
            if callback is not None:
                jax.debug.callback(callback)
            return jnp.sin(x * w) + 0.1 * x, i + 1

        x, _ = fx.filter_while_loop(
            lambda s: s[1] < steps, body, (x0, jnp.array(0)), kind=kind, **options
        )
        return (x**2).sum()

    return loss


def bench_loop_memory(steps: int = 10_000, size: int = 1024) -> None:
    carry_bytes = 4 * size
    print(f"2. gradient of a {steps}-step while loop, carry f32[{size}]")
    for kind, options in [
        ("bounded", {"max_steps": steps}),
        ("checkpointed", {"checkpoints": 16}),
    ]:
        loss = loop_loss(steps, kind, **options)
        compiled = jax.jit(jax.grad(loss)).lower(0.9, jnp.ones(size)).compile()
        temp = compiled.memory_analysis().temp_size_in_bytes
        label = f"kind={kind!r} " + ", ".join(f"{k}={v}" for k, v in options.items())
        print(f"   {label:42s} temporary memory {temp / carry_bytes:9.1f} carries")
    evaluations: list[None] = []
    counted = loop_loss(
        steps, "checkpointed", lambda: evaluations.append(None), checkpoints=16
    )
    jax.block_until_ready(jax.jit(jax.grad(counted))(0.9, jnp.ones(4)))
    per_step = len(evaluations) / steps
    print(
        f"   checkpointed: {per_step:.2f} body evaluations per step (forward 1, "
        f"VJP 1, recomputation {per_step - 2:.2f}; log2(steps) = "
        f"{jnp.log2(steps):.1f})"
    )


# --- 3. Compile time of scan over layers -------------------------------------------


def bench_layers(repeats: int) -> None:
    def stacked(depth: int) -> fx.nn.Linear:
        keys = jax.random.split(jax.random.key(0), depth)
        make = fx.filter_jit(fx.filter_vmap(lambda k: fx.nn.Linear(64, 64, key=k)))
        return make(keys)

    def compile_seconds(layers: fx.nn.Linear) -> float:
        def forward(layers: fx.nn.Linear, x: jax.Array) -> jax.Array:
            return fx.filter_scan(
                lambda h, layer: (jax.nn.relu(layer(h)), None), x, layers
            )[0]

        start = time.perf_counter()
        fx.filter_jit(forward).lower(layers, jnp.ones(64)).compile()
        return time.perf_counter() - start

    models = {"depth 4": stacked(4), "depth 64": stacked(64)}
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(repeats):
        for name, layers in models.items():
            times[name].append(compile_seconds(layers) * 1e3)
    report("3. compile time of scan over layers (Linear 64x64)", times, "ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--calls", type=int, default=300)
    options = parser.parse_args()
    print(f"jax {jax.__version__}, backend {jax.default_backend()}")
    bench_scan(options.repeats, options.calls)
    bench_loop_memory()
    bench_layers(max(3, options.repeats // 3))


if __name__ == "__main__":
    main()
