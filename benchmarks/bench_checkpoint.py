"""Save and restore of a sharded model on 8 devices: `filterax.checkpoint`
against orbax used by hand on the same arrays, and `tree_serialise_leaves`.

The model is about 1 GiB of random float32 arrays (16 matrices; random, so
that nothing compresses on disk), each split over 8
simulated CPU devices, plus a function and a string (what keeps orbax from
taking a filterax Module as it is). Each measurement runs in a fresh
process, so none inherits another's allocator state or caches:

- `filterax.checkpoint.save(dir, model)` / `restore(dir, abstract_like)`;
- orbax by hand: `orbax.checkpoint.StandardCheckpointer` saving the dict of
  the same arrays, restoring into `ShapeDtypeStruct`s with the same shardings;
- `tree_serialise_leaves(path, model)` / `tree_deserialise_leaves(path, like)`.

Reported per measurement: wall time of the call (median of the rounds) and
peak host memory above what the process held just before it (resident memory
sampled every 2 ms in a thread; on CPU the "devices" are host memory too, so
a restore's figure includes the restored arrays themselves), and what stays
resident afterwards, the result still held (after a save, a host copy cached
on the arrays would show here; after a restore, the restored model does),
before and after `malloc_trim` hands memory freed but kept in malloc's
arenas back to the system (orbax's writers leave much there). The
ratios filterax / orbax are printed side by side; the target is at most 1.10
(filterax's figures include the checksum of every file, written at save and
checked at restore).

Then many small leaves: 10,000 float32 arrays of 16 elements on one device, in
a list (with a function beside them), saved and restored by the same three.

No assertions on time.

Run: `python benchmarks/bench_checkpoint.py [--small] [--rounds 3] [--leaves 10000]`
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

MIB = 2**20
ENGINES = ("filterax.checkpoint", "orbax by hand", "tree_serialise_leaves")


def _resident_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB


def _measure(action: Callable[[], Any]) -> dict[str, float]:
    """Runs `action`, sampling resident memory in a thread."""
    gc.collect()
    before = _resident_mib()
    peak = before
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _resident_mib())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    start = time.perf_counter()
    result = action()
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    peak = max(peak, _resident_mib())
    gc.collect()
    kept = _resident_mib() - before  # with the result (of a restore) still held
    # What stays once malloc hands its free arenas back: a host copy cached on
    # the arrays would still be here, memory the writers freed would not.
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    trimmed = _resident_mib() - before
    del result
    return {
        "seconds": seconds,
        "peak_mib": peak - before,
        "kept_mib": kept,
        "trimmed_mib": trimmed,
    }


def _many_leaves(engine: str, operation: str, path: str, leaves: int) -> None:
    """One measurement of `leaves` small arrays, in this fresh process."""
    # Imported here: the parent process must not start JAX or orbax itself.
    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    import filterax as fx
    import filterax.checkpoint as fxc

    def model_of(arrays: list[Any]) -> dict[str, Any]:
        return {"layers": arrays, "activation": jax.nn.gelu}

    shape = jax.ShapeDtypeStruct((16,), jnp.float32)
    like = model_of([shape] * leaves)
    by_hand_like = {f"w{i}": shape for i in range(leaves)}

    def save_by_hand(arrays: list[Any]) -> None:
        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(path, {f"w{i}": a for i, a in enumerate(arrays)})
            checkpointer.wait_until_finished()

    def restore_by_hand() -> Any:
        with ocp.StandardCheckpointer() as checkpointer:
            return jax.block_until_ready(checkpointer.restore(path, by_hand_like))

    action: Callable[[], Any]
    if operation == "save":
        base = jnp.arange(16 * leaves, dtype=jnp.float32).reshape(leaves, 16)
        arrays = jax.block_until_ready(list(base))
        model = model_of(arrays)
        action = {
            "filterax.checkpoint": lambda: fxc.save(path, model),
            "orbax by hand": lambda: save_by_hand(arrays),
            "tree_serialise_leaves": lambda: fx.tree_serialise_leaves(path, model),
        }[engine]
    else:
        action = {
            "filterax.checkpoint": lambda: jax.block_until_ready(
                fxc.restore(path, like)["layers"]
            ),
            "orbax by hand": restore_by_hand,
            "tree_serialise_leaves": lambda: jax.block_until_ready(
                fx.tree_deserialise_leaves(path, like)["layers"]
            ),
        }[engine]
    print(json.dumps(_measure(action)))


def _worker(engine: str, operation: str, path: str, total_mib: int) -> None:
    """One measurement, in this fresh process."""
    # Imported here: the parent process must not start JAX or orbax itself.
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    from jax.sharding import NamedSharding, PartitionSpec as P

    import filterax as fx
    import filterax.checkpoint as fxc

    count = 16
    rows = total_mib * MIB // 4 // count // 1024
    mesh = jax.make_mesh((8,), ("x",))
    sharding = NamedSharding(mesh, P("x"))
    shapes = [
        jax.ShapeDtypeStruct((rows, 1024), jnp.float32, sharding=sharding)
    ] * count

    def model_of(arrays: list[Any]) -> dict[str, Any]:
        return {"layers": arrays, "activation": jax.nn.gelu, "name": "bench"}

    make = jax.jit(
        # Random values: constant ones would compress to nothing on disk.
        lambda: [
            jax.random.normal(jax.random.key(i), (rows, 1024)) for i in range(count)
        ],
        out_shardings=[sharding] * count,
    )
    like = model_of(shapes)
    by_hand_like = {f"w{i}": s for i, s in enumerate(shapes)}

    def save_by_hand(arrays: list[Any]) -> None:
        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(path, {f"w{i}": a for i, a in enumerate(arrays)})
            checkpointer.wait_until_finished()

    def restore_by_hand() -> Any:
        with ocp.StandardCheckpointer() as checkpointer:
            return jax.block_until_ready(checkpointer.restore(path, by_hand_like))

    action: Callable[[], Any]
    if operation == "save":
        arrays = jax.block_until_ready(make())
        model = model_of(arrays)
        action = {
            "filterax.checkpoint": lambda: fxc.save(path, model),
            "orbax by hand": lambda: save_by_hand(arrays),
            "tree_serialise_leaves": lambda: fx.tree_serialise_leaves(path, model),
        }[engine]
    else:
        action = {
            "filterax.checkpoint": lambda: jax.block_until_ready(
                fxc.restore(path, like)["layers"]
            ),
            "orbax by hand": restore_by_hand,
            "tree_serialise_leaves": lambda: jax.block_until_ready(
                fx.tree_deserialise_leaves(path, like)["layers"]
            ),
        }[engine]
    print(json.dumps(_measure(action)))


def _run_worker(
    engine: str, operation: str, path: str, total_mib: int, mode: str = "--worker"
) -> dict:
    result = subprocess.run(
        [sys.executable, __file__, mode, engine, operation, path, str(total_mib)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{engine} {operation} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--small", action="store_true", help="64 MiB, for a quick run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--leaves", type=int, default=10_000, help="small leaves (0: skip)"
    )
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--leaves-worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        engine, operation, path, total = args.worker
        _worker(engine, operation, path, int(total))
        return
    if args.leaves_worker:
        engine, operation, path, count = args.leaves_worker
        _many_leaves(engine, operation, path, int(count))
        return
    total_mib = 64 if args.small else 1024
    print(f"model: {total_mib} MiB of float32, 16 arrays split over 8 CPU devices")
    results: dict[tuple[str, str], list[dict]] = {}
    root = tempfile.mkdtemp(prefix="bench_checkpoint_")
    try:
        for round_index in range(args.rounds):
            for engine in ENGINES:  # interleaved: each sees the same machine noise
                path = os.path.join(root, f"{engine.replace(' ', '_')}.{round_index}")
                for operation in ("save", "restore"):
                    figures = _run_worker(engine, operation, path, total_mib)
                    results.setdefault((engine, operation), []).append(figures)
                shutil.rmtree(path, ignore_errors=True)
                if os.path.exists(path):
                    os.remove(path)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def median(engine: str, operation: str, key: str) -> float:
        return statistics.median(r[key] for r in results[(engine, operation)])

    print(f"median of {args.rounds} rounds, each in a fresh process")
    print(
        f"{'':24s}{'op':>8s}{'time s':>9s}{'peak MiB':>10s}{'kept MiB':>10s}"
        f"{'trimmed':>9s}"
    )
    for engine in ENGINES:
        for operation in ("save", "restore"):
            print(
                f"{engine:24s}{operation:>8s}"
                f"{median(engine, operation, 'seconds'):9.2f}"
                f"{median(engine, operation, 'peak_mib'):10.0f}"
                f"{median(engine, operation, 'kept_mib'):10.0f}"
                f"{median(engine, operation, 'trimmed_mib'):9.0f}"
            )
    for operation in ("save", "restore"):
        for key, what in (("seconds", "time"), ("peak_mib", "peak memory")):
            ours = median("filterax.checkpoint", operation, key)
            theirs = median("orbax by hand", operation, key)
            print(
                f"filterax.checkpoint / orbax by hand, {operation} {what}: "
                f"{ours / theirs:.3f}x (target <= 1.10)"
            )
    if args.leaves:
        _many_leaves_report(args.leaves)


def _many_leaves_report(leaves: int) -> None:
    """One round of the many-leaves measurement, each in a fresh process."""
    print(f"\n{leaves} leaves of float32[16], one device, one round")
    root = tempfile.mkdtemp(prefix="bench_checkpoint_leaves_")
    seconds: dict[tuple[str, str], float] = {}
    try:
        for engine in ENGINES:
            path = os.path.join(root, engine.replace(" ", "_"))
            for operation in ("save", "restore"):
                figures = _run_worker(
                    engine, operation, path, leaves, mode="--leaves-worker"
                )
                seconds[(engine, operation)] = figures["seconds"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for operation in ("save", "restore"):
        print(
            f"{operation:>8s}: "
            + ", ".join(f"{e} {seconds[(e, operation)]:.2f} s" for e in ENGINES)
        )
        ours = seconds[("filterax.checkpoint", operation)]
        print(
            f"{'':10s}filterax.checkpoint / orbax by hand "
            f"{ours / seconds[('orbax by hand', operation)]:.2f}x, "
            f"/ tree_serialise_leaves "
            f"{ours / seconds[('tree_serialise_leaves', operation)]:.2f}x"
        )


if __name__ == "__main__":
    main()
