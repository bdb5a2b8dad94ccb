"""Compiled FLOPs of a `filter_vjp` backward pass given a partial cotangent.

A small MLP-like model returns three named losses. Each case compiles, with
`jax.jit(...).lower(...).compile().cost_analysis()`, a function running the
forward pass and pulling back a cotangent; only its gradient is returned, so XLA
may drop anything that does not feed it. Reported, for every choice of live
losses:

- partial: `filter_vjp` of the three-loss function, `None` for the others;
- restricted: `filter_vjp` of a function returning only the live losses (the
  target: the partial case should cost exactly this);
- zeros: the three-loss function fed materialised zeros for the others (what
  `jax.vjp` needs, since XLA does not fold `x * 0` for floats);

and the ratios partial / restricted (ideally 1.00) and partial / zeros.
FLOPs are deterministic.

A second table times the pullback called eagerly, outside `jit`, in a loop:
`filter_vjp`'s function (full and partial cotangents) against the function
`jax.vjp` returns, in interleaved rounds; minimum per-call times and their ratio
are printed. No assertion is made on the timings.

Run: `python benchmarks/bench_vjp.py [--width 256] [--batch 64] [--rounds 7]`
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import filterax as fx

NAMES = ("fit", "smooth", "sparse")


def make_params(width: int) -> dict[str, Any]:
    keys = jax.random.split(jax.random.key(0), 4)
    return {
        "embed": jax.random.normal(keys[0], (width, width)) / width**0.5,
        "heads": {
            name: jax.random.normal(key, (width, width)) / width**0.5
            for name, key in zip(NAMES, keys[1:])
        },
        "steps": jnp.array(0),
    }


def losses(params: dict[str, Any], x: jax.Array) -> dict[str, jax.Array]:
    hidden = jnp.tanh(x @ params["embed"])
    heads = {name: jnp.tanh(hidden @ w) @ w for name, w in params["heads"].items()}
    return {
        "fit": ((heads["fit"] - x) ** 2).mean(),
        "smooth": jnp.abs(jnp.diff(heads["smooth"], axis=0)).mean(),
        "sparse": jnp.abs(heads["sparse"]).mean(),
    }


def restricted(live: tuple[str, ...]) -> Callable[..., dict[str, jax.Array]]:
    def only_live(params: dict[str, Any], x: jax.Array) -> dict[str, jax.Array]:
        out = losses(params, x)
        return {name: out[name] for name in live}

    return only_live


def flops(fun: Callable[..., Any], *args: Any) -> float:
    return float(jax.jit(fun).lower(*args).compile().cost_analysis().get("flops", 0.0))


def backward_flops(
    fun: Callable[..., Any], cotangent: dict[str, Any], params: Any, x: jax.Array
) -> float:
    def pull_back(params: Any, x: jax.Array) -> Any:
        _, vjp_fn = fx.filter_vjp(fun, params, x)
        return vjp_fn(cotangent)[0]

    return flops(pull_back, params, x)


def eager_pullback_us(pull_back: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        jax.block_until_ready(pull_back())
    return (time.perf_counter() - start) / calls * 1e6


def eager_table(params: Any, x: jax.Array, rounds: int, calls: int) -> None:
    one = jnp.ones(())
    full_ct = {name: one for name in NAMES}
    partial_ct = {name: one if name == "fit" else None for name in NAMES}
    _, ours = fx.filter_vjp(losses, params, x)
    _, floor = jax.vjp(losses, params, x)
    cases = {
        "full cotangent": (lambda: ours(full_ct), lambda: floor(full_ct)),
        "partial cotangent": (
            lambda: ours(partial_ct),
            lambda: floor({n: one if n == "fit" else jnp.zeros(()) for n in NAMES}),
        ),
    }
    print(f"\neager pullback, {calls} calls per round, best of {rounds} rounds")
    for name, (ours_call, floor_call) in cases.items():
        for call in (ours_call, floor_call):
            jax.block_until_ready(call())
        ours_times, floor_times = [], []
        for _ in range(rounds):
            ours_times.append(eager_pullback_us(ours_call, calls))
            floor_times.append(eager_pullback_us(floor_call, calls))
        low, floor_low = min(ours_times), min(floor_times)
        print(
            f"  {name:<18} filter_vjp {low:9.1f} us  jax.vjp {floor_low:9.1f} us"
            f"   ratio {low / floor_low:4.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    params = make_params(args.width)
    x = jax.random.normal(jax.random.key(1), (args.batch, args.width))
    one = jnp.ones(())

    print(f"width {args.width}, batch {args.batch}; compiled FLOPs (millions)")
    print(
        f"{'live losses':<22}{'partial':>10}{'restricted':>12}{'zeros':>10}"
        f"{'partial/restricted':>20}{'partial/zeros':>15}"
    )
    for count in (1, 2):
        for live in itertools.combinations(NAMES, count):
            partial_ct = {name: one if name in live else None for name in NAMES}
            zeros_ct = {name: one if name in live else jnp.zeros(()) for name in NAMES}
            live_ct = {name: one for name in live}
            partial = backward_flops(losses, partial_ct, params, x)
            target = backward_flops(restricted(live), live_ct, params, x)
            zeros = backward_flops(losses, zeros_ct, params, x)
            print(
                f"{'+'.join(live):<22}{partial / 1e6:>10.2f}{target / 1e6:>12.2f}"
                f"{zeros / 1e6:>10.2f}{partial / target:>20.3f}"
                f"{partial / zeros:>15.3f}"
            )
    eager_table(params, x, args.rounds, args.calls)


if __name__ == "__main__":
    main()
