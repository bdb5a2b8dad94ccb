"""Building a model larger than one device's share on 8 devices:
`sharded_init` against building it eagerly and then placing it.

The model is a list of `nn.Linear` layers whose parameters total 8 times one
device's share; the rules split every parameter 8 ways over a one-axis mesh. Reported per device:

- the share: the bytes of the model each device holds once built;
- `sharded_init`: the peak memory of building it. From
  `jax.Device.memory_stats()` (`peak_bytes_in_use`) where the backend keeps
  them; otherwise (CPU) from the compiled function's memory analysis
  (arguments + outputs + temporaries, per device), of the very computation
  `sharded_init` compiles (the constructor's array part, `jax.jit` with the
  shardings of `sharding_of` as `out_shardings`);
- eager then `filter_shard`: the same measure for building the model on one
  device (as a constructor does), which must hold all of it before placing.

- `sharded_init(stages=8)`: the same built in 8 compiled stages (each
  making about an eighth of the arrays): over the stages, the arrays already
  built plus the stage's own peak; with the number of compilations and the
  build time from a cold cache against one stage.
- the stacked form of the same model (`filter_vmap` over the keys: one array
  per parameter, which a whole-array stage makes whole), in one stage, with
  `stages=8`, and with `mapped=True` in 8, 16 and 32 runs of the stack (each
  written into the arrays already placed): peak, compilations, build time,
  and whether the values equal an eager call of the constructor.

The target: at most 1.25 x the share, for the list with `stages=8` and for the
stack with mapped runs. For scale, the peak of JAX's own
`jax.random.uniform` of the same size compiled straight onto the same sharding
is printed too: on XLA's CPU backend the threefry PRNG keeps temporaries of
about 3 x its output live, which no constructor can avoid; whole-array stages
end at the share plus the last stage's temporaries, and runs of a stack at
about `1 + 4 / runs` times the share. Ratios are printed side by side; the
build times are wall time on this machine and asserted nowhere.

Run: `python benchmarks/bench_sharded_init.py [--small]`
"""

from __future__ import annotations

import jax

jax.config.update("jax_num_cpu_devices", 8)

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import filterax as fx  # noqa: E402
from filterax._sharding._init import _plan  # noqa: E402
from filterax._tree._filters import is_array  # noqa: E402
from filterax._tree._split import split  # noqa: E402

RULES = {"stack": None, "out": "model", "in": None}
STAGES = 8


def make_layers(width: int, depth: int) -> Any:
    def make(key: Any) -> list[fx.nn.Linear]:
        return [fx.nn.Linear(width, width, key=k) for k in jax.random.split(key, depth)]

    return make, (jax.random.key(0),)


def make_stack(width: int, depth: int) -> Any:
    return fx.filter_vmap(lambda key: fx.nn.Linear(width, width, key=key)), (
        jax.random.split(jax.random.key(0), depth),
    )


def _peak_per_device(compiled: Any) -> int:
    analysis = compiled.memory_analysis()
    return int(
        analysis.argument_size_in_bytes
        + analysis.output_size_in_bytes
        + analysis.temp_size_in_bytes
        - analysis.alias_size_in_bytes
    )


def _device_peak() -> int | None:
    stats = jax.devices()[0].memory_stats()
    return None if not stats else int(stats.get("peak_bytes_in_use", 0)) or None


def eager_compiled(make: Any, args: tuple) -> Any:
    """The constructor's array part compiled for one device, as an eager
    build (then placed) must hold all of it."""
    dynamic, static = split((make, args), is_array)

    def arrays(traced: list[Any]) -> Any:
        call_make, call_args = static.merge(traced)
        return split(call_make(*call_args), is_array)[0]

    return jax.jit(arrays).lower(dynamic).compile()


def staged_peak(
    make: Any, args: tuple, mesh: Any, stages: int, mapped: bool = False
) -> tuple[int, int]:
    """`sharded_init(..., stages=stages, mapped=mapped)`'s peak per device,
    from the very functions it compiles (over whole-array stages, the arrays
    already built plus the stage's own compiled peak; over runs of a stack,
    the placed arrays plus one run's); and the number of compilations."""
    plan = _plan(make, mesh, RULES, stages, args, {}, mapped=mapped)
    compilations = len(plan.stages) if hasattr(plan, "stages") else 2
    return plan.peak_bytes_per_device(), compilations


def build_seconds(
    make: Any, args: tuple, mesh: Any, stages: int, mapped: bool = False
) -> tuple[float, bool]:
    """Wall time of one build from a cold cache (tracing, compiling, running),
    and whether its values equal an eager call of `make`."""
    fx.clear_caches()
    start = time.perf_counter()
    built = fx.sharded_init(make, mesh, RULES, stages=stages, mapped=mapped)(*args)
    jax.block_until_ready(built)
    seconds = time.perf_counter() - start
    return seconds, bool(fx.tree_equal(built, make(*args)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run")
    args = parser.parse_args(argv)
    width, depth = (256, 8) if args.small else (1024, 32)
    mesh = jax.make_mesh((8,), ("model",), axis_types=(jax.sharding.AxisType.Auto,))
    make, make_args = make_layers(width, depth)

    model = fx.sharded_init(make, mesh, RULES)(*make_args)
    total = sum(leaf.nbytes for leaf in jax.tree.leaves(model) if fx.is_array(leaf))
    share = max(
        sum(
            shard.data.nbytes
            for leaf in jax.tree.leaves(model)
            if fx.is_array(leaf)
            for shard in leaf.addressable_shards
            if shard.device == device
        )
        for device in jax.devices()
    )
    device_peak = _device_peak()
    one_peak, _ = staged_peak(make, make_args, mesh, 1)
    sharded_peak = device_peak or one_peak
    eager_peak = _peak_per_device(eager_compiled(make, make_args))
    # JAX's own floor: one `jax.random.uniform` of the whole model's size,
    # compiled straight onto the same sharding (no filterax involved).
    floor = jax.jit(
        lambda key: jax.random.uniform(key, (depth, width, width)),
        out_shardings=jax.sharding.NamedSharding(
            mesh, jax.sharding.PartitionSpec(None, "model")
        ),
    )
    floor_peak = _peak_per_device(floor.lower(jax.random.key(0)).compile())
    source = "memory_stats" if device_peak else "compiled memory analysis"
    mib = 2**20
    print(
        f"model {total / mib:.1f} MiB on 8 devices ({depth} x nn.Linear({width}, "
        f"{width})); share per device {share / mib:.2f} MiB"
    )
    print(f"peak per device ({source}):")
    print(
        f"  sharded_init (one stage)  {sharded_peak / mib:8.2f} MiB  "
        f"{sharded_peak / share:5.2f} x share (1 compilation)"
    )
    staged, n_stages = staged_peak(make, make_args, mesh, STAGES)
    print(
        f"  sharded_init(stages={STAGES})   {staged / mib:8.2f} MiB  "
        f"{staged / share:5.2f} x share ({n_stages} compilations)"
    )
    print(
        f"  eager, then placed        {eager_peak / mib:8.2f} MiB  "
        f"{eager_peak / share:5.2f} x share (on the one device that builds it)"
    )
    print(
        f"  jax.random.uniform        {floor_peak / mib:8.2f} MiB  "
        f"{floor_peak / share:5.2f} x share (the same size straight onto the "
        "sharding: the PRNG's own temporaries)"
    )
    (one, one_equal), (several, several_equal) = (
        build_seconds(make, make_args, mesh, n) for n in (1, STAGES)
    )
    print(
        f"build time from a cold cache (trace, compile, run): {one:.2f} s in one "
        f"stage, {several:.2f} s in {STAGES} ({several / one:.2f}x); values equal "
        f"to eager make: {one_equal and several_equal}"
    )
    stack, stack_args = make_stack(width, depth)
    stack_one, _ = staged_peak(stack, stack_args, mesh, 1)
    stack_staged, stack_stages = staged_peak(stack, stack_args, mesh, STAGES)
    print(
        f"stacked (filter_vmap) model, {depth} layers, one array per parameter: "
        f"{stack_one / share:.2f} x share in one stage, {stack_staged / share:.2f} x "
        f"with stages={STAGES} ({stack_stages} compilations: a stage makes whole "
        "arrays)"
    )
    stack_seconds, _ = build_seconds(stack, stack_args, mesh, 1)
    mapped_ok = False
    for runs in (8, 16, 32):
        if runs > depth:
            continue
        peak, compilations = staged_peak(stack, stack_args, mesh, runs, mapped=True)
        seconds, equal = build_seconds(stack, stack_args, mesh, runs, mapped=True)
        mapped_ok = mapped_ok or peak <= 1.25 * share
        print(
            f"  stages={runs:2d}, mapped=True (runs of the stack): "
            f"{peak / share:.2f} x share, {compilations} compilations, "
            f"{seconds:.2f} s against {stack_seconds:.2f} s in one stage; values "
            f"equal to eager make: {equal}"
        )
    ok = staged <= 1.25 * share and mapped_ok
    print(
        f"target (<= 1.25 x share; list: stages={STAGES}, stack: mapped runs):",
        "met" if ok else "MISSED",
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
