"""Loading onto 8 devices holds one shard at a time on the host, not the
model: the benchmark's measurement (`benchmarks/bench_safetensors.py`), at a
small size. Host buffers are counted by `tracemalloc`, and the resident
memory read from `/proc/self/status`, in a fresh process: counts of bytes,
not times."""

from __future__ import annotations

from types import ModuleType

BENCHMARK = "bench_safetensors"  # loaded by the `bench` fixture (conftest.py)


def test_host_staging_stays_under_one_devices_share(bench: ModuleType) -> None:
    figures = bench.run(16)  # a 16 MiB model: 2 MiB per device, 256 KiB shards
    share, model = figures["share"], figures["model"]
    assert model == 8 * share
    # One shard read and copied at a time (each shard is an eighth of a share).
    assert figures["filterax"]["staging"] < 0.75 * share, figures
    # The file is mapped one tensor (here one share) at a time: the process's
    # resident memory beyond the loaded arrays stays far from the model.
    assert figures["filterax"]["over_result"] < 0.5 * model, figures
    # The control holds the whole model on the host.
    assert figures["whole file"]["staging"] > 0.9 * model, figures
