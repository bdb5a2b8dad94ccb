"""Compile time against depth: a transformer unrolled in Python, against the
same blocks in `nn.Stacked` (with and without `remat`).

The model is a stack of pre-norm transformer blocks built from `filterax.nn`
layers (`LayerNorm`, `MultiheadAttention` with a causal mask, `MLP`; width 64,
4 heads), acting on one sequence and mapped over a batch with `jax.vmap`. A
step is loss, gradient and an SGD update, jitted with `jax.jit` over the
model's arrays.

For each depth and form, one process measures:

- trace + lower: `jax.jit(step).trace(...).lower()`;
- compile: `.compile()` of that;
- step time: the compiled step, repeated, interleaving the forms of one depth
  so that drifts in machine load hit them alike (minimum and median).

and prints every figure and the ratios the contract targets (`../shared/API.md`
section 13): stacked depth 48 at most 1.5x stacked depth 4 in trace +
compile, and a stacked step at most 1.05x the unrolled one. JAX's persistent
compilation cache is left off, so every compilation is a real one. No
assertion is made on the timings.

Run: `python benchmarks/bench_compile.py [--depths 4 16 48] [--small]
[--repeats R]`. The unrolled depth 48 alone compiles for about two minutes on
a 2-core CPU; `--small` runs depths 2 and 4 in a few seconds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp

import filterax as fx
from filterax import nn

WIDTH = 64
HEADS = 4
SEQUENCE = 32
BATCH = 8
LEARNING_RATE = 1e-3


class Block(fx.Module):
    """`x + attention(norm(x))`, then `x + mlp(norm(x))`, on one sequence."""

    attention_norm: nn.LayerNorm
    attention: nn.MultiheadAttention
    mlp_norm: nn.LayerNorm
    mlp: nn.MLP

    def __init__(self, key: jax.Array):
        attention_key, mlp_key = jax.random.split(key)
        self.attention_norm = nn.LayerNorm(WIDTH)
        self.attention = nn.MultiheadAttention(HEADS, WIDTH, key=attention_key)
        self.mlp_norm = nn.LayerNorm(WIDTH)
        self.mlp = nn.MLP(
            WIDTH, WIDTH, 4 * WIDTH, depth=1, activation=jax.nn.gelu, key=mlp_key
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        causal = jnp.tril(jnp.ones((x.shape[0], x.shape[0]), dtype=bool))
        h = jax.vmap(self.attention_norm)(x)
        x = x + self.attention(h, h, h, causal)
        return x + jax.vmap(self.mlp)(jax.vmap(self.mlp_norm)(x))


class Unrolled(fx.Module):
    """The blocks as a tuple, applied by a Python loop."""

    blocks: tuple[Block, ...]

    def __call__(self, x: jax.Array) -> jax.Array:
        for block in self.blocks:
            x = block(x)
        return x


def make_model(form: str, depth: int) -> Any:
    key = jax.random.key(0)
    if form == "unrolled":
        keys = jax.random.split(key, depth)
        return Unrolled(tuple(Block(k) for k in keys))
    return nn.Stacked(Block, depth, key=key, remat=form == "stacked+remat")


def make_step(model: Any) -> tuple[Any, Any]:
    """A jitted SGD step over the arrays of `model`, and those arrays."""
    params, static = fx.partition(model, fx.is_array)

    def loss(model: Any, x: jax.Array) -> jax.Array:
        return jnp.mean(jax.vmap(model)(x) ** 2)

    def step(params: Any, x: jax.Array) -> tuple[Any, jax.Array]:
        model = fx.combine(params, static)
        value, grads = fx.filter_value_and_grad(loss)(model, x)
        updates = jax.tree.map(lambda g: -LEARNING_RATE * g, grads)
        new_params, _ = fx.partition(fx.apply_updates(model, updates), fx.is_array)
        return new_params, value

    return jax.jit(step), params


def measure_compile(form: str, depth: int, x: jax.Array) -> dict[str, Any]:
    model = make_model(form, depth)
    step, params = make_step(model)
    start = time.perf_counter()
    lowered = step.trace(params, x).lower()
    traced = time.perf_counter()
    compiled = lowered.compile()
    done = time.perf_counter()
    jax.block_until_ready(compiled(params, x))  # warm up
    return {
        "trace": traced - start,
        "compile": done - traced,
        "compiled": compiled,
        "params": params,
        "times": [],
    }


def time_steps(results: dict[str, dict[str, Any]], x: jax.Array, repeats: int) -> None:
    """Interleaved: one step of each form in turn, `repeats` rounds."""
    for _ in range(repeats):
        for result in results.values():
            start = time.perf_counter()
            jax.block_until_ready(result["compiled"](result["params"], x))
            result["times"].append(time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[4, 16, 48])
    parser.add_argument(
        "--small", action="store_true", help="depths 2 and 4, few repeats"
    )
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument(
        "--forms",
        nargs="+",
        default=["unrolled", "stacked", "stacked+remat"],
        choices=["unrolled", "stacked", "stacked+remat"],
    )
    args = parser.parse_args()
    depths = [2, 4] if args.small else args.depths
    repeats = 5 if args.small else args.repeats
    x = jax.random.normal(jax.random.key(1), (BATCH, SEQUENCE, WIDTH))
    print(
        f"jax {jax.__version__} on {jax.devices()[0].platform}; transformer width "
        f"{WIDTH}, {HEADS} heads, batch {BATCH} x {SEQUENCE}; gradient step; "
        f"{repeats} timed steps per form"
    )

    table: dict[tuple[str, int], dict[str, Any]] = {}
    for depth in depths:
        results = {}
        for form in args.forms:
            results[form] = measure_compile(form, depth, x)
            table[form, depth] = results[form]
        time_steps(results, x, repeats)
        for form in args.forms:
            result = results[form]
            result["min"] = min(result["times"])
            result["median"] = statistics.median(result["times"])
            # Free the compiled program (the unrolled one is large).
            del result["compiled"], result["params"]

    print()
    print(
        f"{'form':<15}{'depth':>6}{'trace+lower':>13}{'compile':>10}"
        f"{'total':>10}{'step min':>11}{'step median':>13}"
    )
    for (form, depth), r in sorted(
        table.items(), key=lambda item: (item[0][1], item[0][0])
    ):
        print(
            f"{form:<15}{depth:>6}{r['trace']:>12.3f}s{r['compile']:>9.3f}s"
            f"{r['trace'] + r['compile']:>9.3f}s{r['min'] * 1e3:>9.2f}ms"
            f"{r['median'] * 1e3:>11.2f}ms"
        )

    print()
    shallow, deep = min(depths), max(depths)
    for form in args.forms:
        first, last = table[form, shallow], table[form, deep]
        ratio = (last["trace"] + last["compile"]) / (first["trace"] + first["compile"])
        target = "  (target <= 1.5)" if form.startswith("stacked") else ""
        print(
            f"{form}: trace+compile depth {deep} / depth {shallow} = {ratio:.2f}x"
            f"{target}"
        )
    if "unrolled" in args.forms:
        for form in args.forms:
            if form == "unrolled":
                continue
            for depth in depths:
                mine, unrolled = table[form, depth], table["unrolled", depth]
                compile_ratio = (unrolled["trace"] + unrolled["compile"]) / (
                    mine["trace"] + mine["compile"]
                )
                print(
                    f"depth {depth}: {form} step / unrolled step = "
                    f"{mine['min'] / unrolled['min']:.3f}x (min), "
                    f"{mine['median'] / unrolled['median']:.3f}x (median)"
                    f"{'  (target <= 1.05)' if form == 'stacked' else ''}; "
                    f"unrolled trace+compile / {form} = {compile_ratio:.1f}x"
                )


if __name__ == "__main__":
    main()
