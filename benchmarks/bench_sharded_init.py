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
  built plus the stage's own peak; with the build time from a cold cache
  against one stage, and the stacked form's peaks (one array per parameter,
  which a stage makes whole).

The target: `sharded_init(stages=8)`'s peak at most 1.25 x the share. For scale, the
peak of JAX's own `jax.random.uniform` of the same size compiled straight onto
the same sharding is printed too: on XLA's CPU backend the threefry PRNG keeps
temporaries of about 3 x its output live, which no constructor can avoid.
Ratios are printed side by side; nothing is timed.

Run: `python benchmarks/bench_sharded_init.py [--small]`
"""

from __future__ import annotations

import jax

jax.config.update("jax_num_cpu_devices", 8)

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from jax.extend.core import jaxpr_as_fun  # noqa: E402

import filterax as fx  # noqa: E402
from filterax._filters import is_array  # noqa: E402
from filterax._sharding._init import _bytes_per_device, _stage_groups  # noqa: E402
from filterax._sharding._rules import flat_shardings  # noqa: E402
from filterax._split import split  # noqa: E402

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


def compiled_init(make: Any, args: tuple, mesh: Any, sharded: bool) -> Any:
    """The computation `sharded_init` compiles (with `sharded`), or the same
    constructor compiled for one device."""
    abstract = fx.filter_eval_shape(make, *args)
    shardings, _ = flat_shardings(abstract, mesh, RULES)
    out_shardings = [
        s
        for leaf, s in zip(jax.tree.leaves(abstract), shardings)
        if isinstance(leaf, jax.ShapeDtypeStruct)
    ]
    dynamic, static = split((make, args), is_array)

    def arrays(traced: list[Any]) -> Any:
        call_make, call_args = static.merge(traced)
        return split(call_make(*call_args), is_array)[0]

    if sharded:
        jitted = jax.jit(arrays, out_shardings=out_shardings)
    else:
        jitted = jax.jit(arrays)
    return jitted.lower(dynamic).compile()


def staged_peak(make: Any, args: tuple, mesh: Any, stages: int) -> tuple[int, int]:
    """`sharded_init(..., stages=stages)`'s peak per device: over its stages,
    the arrays already built plus the stage's own compiled peak; and the
    number of stages."""
    abstract = fx.filter_eval_shape(make, *args)
    shardings, _ = flat_shardings(abstract, mesh, RULES)
    pairs = [
        (leaf, s)
        for leaf, s in zip(jax.tree.leaves(abstract), shardings)
        if isinstance(leaf, jax.ShapeDtypeStruct)
    ]
    sizes = [_bytes_per_device(leaf, s) for leaf, s in pairs]
    groups = _stage_groups(sizes, stages)
    dynamic, static = split((make, args), is_array)

    def arrays(traced: list[Any]) -> Any:
        call_make, call_args = static.merge(traced)
        return split(call_make(*call_args), is_array)[0]

    run = jaxpr_as_fun(jax.make_jaxpr(arrays)(dynamic))
    inputs = jax.tree.leaves(dynamic)
    built = peak = 0
    for group in groups:
        stage = jax.jit(
            lambda flat, group=group: [run(*flat)[i] for i in group],
            out_shardings=[pairs[i][1] for i in group],
        )
        peak = max(peak, built + _peak_per_device(stage.lower(inputs).compile()))
        built += sum(sizes[i] for i in group)
    return peak, len(groups)


def build_seconds(make: Any, args: tuple, mesh: Any, stages: int) -> float:
    """Wall time of one build from a cold cache (tracing, compiling, running)."""
    fx.clear_caches()
    start = time.perf_counter()
    jax.block_until_ready(fx.sharded_init(make, mesh, RULES, stages=stages)(*args))
    return time.perf_counter() - start


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
    sharded_peak = device_peak or _peak_per_device(
        compiled_init(make, make_args, mesh, sharded=True)
    )
    eager_peak = _peak_per_device(compiled_init(make, make_args, mesh, sharded=False))
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
        f"model {total / mib:.1f} MiB on 8 devices; share per device {share / mib:.2f} MiB"
    )
    print(f"peak per device ({source}):")
    print(
        f"  sharded_init          {sharded_peak / mib:8.2f} MiB  "
        f"{sharded_peak / share:5.2f} x share"
    )
    print(
        f"  eager, then placed    {eager_peak / mib:8.2f} MiB  "
        f"{eager_peak / share:5.2f} x share (on the one device that builds it)"
    )
    print(
        f"  jax.random.uniform    {floor_peak / mib:8.2f} MiB  "
        f"{floor_peak / share:5.2f} x share (the same size straight onto the "
        "sharding: the PRNG's own temporaries)"
    )
    staged, n_stages = staged_peak(make, make_args, mesh, STAGES)
    print(
        f"  sharded_init(stages={STAGES}) {staged / mib:6.2f} MiB  "
        f"{staged / share:5.2f} x share ({n_stages} compiled stages)"
    )
    one, several = (build_seconds(make, make_args, mesh, n) for n in (1, STAGES))
    print(
        f"build time from a cold cache: {one:.2f} s in one stage, {several:.2f} s "
        f"in {STAGES} ({several / one:.2f}x)"
    )
    stack, stack_args = make_stack(width, depth)
    stack_one = _peak_per_device(compiled_init(stack, stack_args, mesh, sharded=True))
    stack_staged, _ = staged_peak(stack, stack_args, mesh, STAGES)
    print(
        f"stacked layers (one array per parameter, {depth} layers deep): "
        f"{stack_one / share:.2f} x share in one stage, {stack_staged / share:.2f} x "
        f"in {STAGES} (a stage makes whole arrays)"
    )
    ok = staged <= 1.25 * share
    print(f"target (<= 1.25 x share, stages={STAGES}):", "met" if ok else "MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
