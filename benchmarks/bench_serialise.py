"""Throughput and memory of `tree_serialise_leaves` / `tree_deserialise_leaves`,
side by side with `numpy.save` / `numpy.load` of the same arrays in one process.

The model is about 200 MB of float32 arrays (a few large, many small). Each
timing is the best of several interleaved rounds, so both sides see the same
machine noise; there are no assertions on time. Reported:

- save MB/s: filterax to a path (atomic: temporary file, fsync, rename), filterax
  to an open file (no fsync), `numpy.save` of each array in turn to one open
  file, and the same followed by an fsync; every save creates a new file;
- load MB/s: filterax into a `like` of NumPy arrays and of JAX arrays,
  filterax reading the `numpy.save` file (which is what Equinox writes: an
  Equinox-format checkpoint), and `numpy.load` of each array in turn;
- peak host memory (tracemalloc) while saving and loading, above what the
  result holds, against the largest leaf: streaming keeps it within one leaf,
  independent of the model size.

Run: `python benchmarks/bench_serialise.py [--mb 200] [--rounds 3]`
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import filterax as fx

MB = 1e6


def make_model(total_mb: float) -> dict[str, np.ndarray]:
    """Large and small float32 arrays, about `total_mb` MB in all."""
    rng = np.random.default_rng(0)
    large, small = int(total_mb * 0.8 / 8 * MB) // 4, int(total_mb * 0.2 / 40 * MB) // 4
    model = {
        f"large_{i}": rng.standard_normal(large, dtype=np.float32) for i in range(8)
    }
    model.update(
        {
            f"small_{i:02d}": rng.standard_normal(small, dtype=np.float32)
            for i in range(40)
        }
    )
    return model


def best_time(function: Callable[[], Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mb", type=float, default=200.0, help="model size in MB")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    model = make_model(args.mb)
    size = sum(a.nbytes for a in model.values())
    largest = max(a.nbytes for a in model.values())
    jax_model = {name: jnp.asarray(array) for name, array in model.items()}
    jax.block_until_ready(jax_model)
    numpy_like = {name: np.zeros_like(array) for name, array in model.items()}

    with tempfile.TemporaryDirectory() as directory:
        ours, theirs = (
            os.path.join(directory, "model.fx"),
            os.path.join(directory, "model.npy"),
        )

        def save_filterax_path() -> None:
            fx.tree_serialise_leaves(ours, jax_model)

        # Every save writes a new file (the atomic path always does): writing
        # over an existing file reuses its cached pages and is not comparable.
        def fresh(path: str) -> str:
            if os.path.exists(path):
                os.unlink(path)
            return path

        def save_filterax_file() -> None:
            with open(fresh(ours), "wb") as file:
                fx.tree_serialise_leaves(file, jax_model)

        def save_numpy(sync: bool = False) -> None:
            with open(fresh(theirs), "wb") as file:
                for array in jax_model.values():
                    np.save(file, np.asarray(array))
                if sync:
                    file.flush()
                    os.fsync(file.fileno())

        def load_filterax_numpy() -> Any:
            return fx.tree_deserialise_leaves(ours, numpy_like)

        def load_filterax_jax() -> Any:
            return jax.block_until_ready(fx.tree_deserialise_leaves(ours, jax_model))

        def load_filterax_equinox_format() -> Any:
            # Dict keys flatten sorted, which is also the order they were saved in.
            return fx.tree_deserialise_leaves(theirs, numpy_like)

        def load_numpy() -> Any:
            with open(theirs, "rb") as file:
                return {name: np.load(file) for name in model}

        save_rows = [
            ("filterax, path (atomic + fsync)", save_filterax_path),
            ("filterax, open file", save_filterax_file),
            ("numpy.save, open file", save_numpy),
            ("numpy.save, open file + fsync", lambda: save_numpy(sync=True)),
        ]
        load_rows = [
            ("filterax, like = NumPy arrays", load_filterax_numpy),
            ("filterax, like = JAX arrays", load_filterax_jax),
            ("filterax, Equinox format", load_filterax_equinox_format),
            ("numpy.load", load_numpy),
        ]
        times: dict[str, list[float]] = {}
        for _ in range(args.rounds):  # interleaved: every variant once per round
            for label, function in save_rows + load_rows:
                times.setdefault(label, []).append(best_time(function, 1))

        for loaded in (load_filterax_numpy(), load_filterax_equinox_format()):
            assert all((loaded[name] == model[name]).all() for name in model)

        def peak_above_result(function: Callable[[], Any]) -> float:
            """Peak traced host memory above what the result still holds at
            the end (NumPy results; JAX results on CPU may alias host buffers)."""
            tracemalloc.start()
            try:
                result = function()  # noqa: F841  (kept alive while measuring)
                held, top = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            return top - held

        memory_rows = [
            ("save, filterax (path)", peak_above_result(save_filterax_path)),
            ("load, filterax, like = NumPy", peak_above_result(load_filterax_numpy)),
            ("load, filterax, like = JAX", peak_above_result(load_filterax_jax)),
            (
                "load, filterax, Equinox format",
                peak_above_result(load_filterax_equinox_format),
            ),
            ("load, numpy.load", peak_above_result(load_numpy)),
        ]

    print(
        f"model: {size / MB:.0f} MB in {len(model)} float32 arrays (largest {largest / MB:.1f} MB)"
    )
    print(
        f"jax {jax.__version__}, numpy {np.__version__}, backend {jax.default_backend()}"
    )
    for title, rows in (("save", save_rows), ("load", load_rows)):
        print(f"\n{title}:")
        for label, _ in rows:
            print(f"  {label:<34} {size / MB / min(times[label]):8.0f} MB/s")
    print("\npeak host memory above the result (tracemalloc):")
    for label, value in memory_rows:
        print(f"  {label:<34} {value / MB:8.2f} MB")
    print(f"  {'(largest leaf)':<34} {largest / MB:8.2f} MB")


if __name__ == "__main__":
    main()
