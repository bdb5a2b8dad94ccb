"""Checksums of every file of a checkpoint: written once its files are
complete, checked on every restore.

Each process sums the files it wrote (those under orbax's `ocdbt.process_<i>`
and `process_<i>` paths; the primary process sums all others) into
`filterax.checksums/process_<i>.json`: `{"files": {relative path: [size,
[crc32 of each block of 64 MiB]]}, "check": <crc32 of the files record>}`
(blocks, so that large files are summed and checked by several threads). Restoring checks every listed
file: a flipped bit, a truncated, missing or replaced file raises
`SerialisationError` naming the file.

Imports the standard library and `_serialisation._messages` only.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .._serialisation._messages import SerialisationError

__all__ = ["CHECKSUMS", "read_checksums", "verify", "write_checksums"]

CHECKSUMS = "filterax.checksums"
_CHUNK = 2**20
_OWNER = re.compile(r"(?:^|[./])process_(\d+)$")


def _owner(relative: str) -> int:
    """The process that wrote the file at `relative`: the `<i>` of a path part
    `ocdbt.process_<i>` or `process_<i>`, else the primary process, 0."""
    for part in relative.split("/"):
        match = _OWNER.search(part)
        if match:
            return int(match.group(1))
    return 0


_BLOCK = 64 * 2**20


def _block_crc(path: str, start: int, length: int) -> tuple[int, int]:
    """The byte count and CRC-32 of `length` bytes of the file at `path` from
    `start` (fewer bytes where the file ends first)."""
    crc = 0
    count = 0
    buffer = bytearray(min(_CHUNK, max(length, 1)))
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as file:
        file.seek(start)
        while count < length:
            got = file.readinto(view[: min(len(view), length - count)])
            if not got:
                break
            crc = zlib.crc32(view[:got], crc)
            count += got
    return count, crc


def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(min(8, os.cpu_count() or 1))


def _sums(paths: list[str]) -> list[tuple[int, list[int]]]:
    """The size and block CRC-32s of each file, computed by several threads
    (the checksum releases the GIL)."""
    jobs = []
    sizes = []
    for index, path in enumerate(paths):
        size = os.path.getsize(path)
        sizes.append(size)
        for start in range(0, max(size, 1), _BLOCK):
            jobs.append((index, path, start))
    with _pool() as pool:
        crcs = list(pool.map(lambda job: _block_crc(job[1], job[2], _BLOCK)[1], jobs))
    blocks: list[list[int]] = [[] for _ in paths]
    for (index, _, _), crc in zip(jobs, crcs):
        blocks[index].append(crc)
    return [(size, crc_list) for size, crc_list in zip(sizes, blocks)]


def _files(checkpoint: str) -> list[str]:
    """Every file under `checkpoint`, relative, but the checksums."""
    found = []
    for root, directories, names in os.walk(checkpoint):
        directories[:] = [d for d in directories if d != CHECKSUMS]
        for name in names:
            found.append(os.path.relpath(os.path.join(root, name), checkpoint))
    return sorted(path.replace(os.sep, "/") for path in found)


def _check_of(files: dict[str, Any]) -> int:
    return zlib.crc32(json.dumps(files, sort_keys=True).encode())


def write_checksums(checkpoint: str, process: int) -> None:
    """Sums the files process `process` wrote under `checkpoint`, and writes
    them (atomically) to its checksum file."""
    mine = [relative for relative in _files(checkpoint) if _owner(relative) == process]
    sums = _sums([os.path.join(checkpoint, relative) for relative in mine])
    files = {relative: [size, crcs] for relative, (size, crcs) in zip(mine, sums)}
    directory = os.path.join(checkpoint, CHECKSUMS)
    os.makedirs(directory, exist_ok=True)
    target = os.path.join(directory, f"process_{process}.json")
    partial = f"{target}.partial"
    with open(partial, "w") as file:
        json.dump({"files": files, "check": _check_of(files)}, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, target)


def read_checksums(
    checkpoint: str, where: str
) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Every file of the checkpoint with its size and CRC-32, from the
    checksum files, checked for damage themselves."""
    directory = os.path.join(checkpoint, CHECKSUMS)
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        raise SerialisationError(
            f"{where} has no checksums ({CHECKSUMS}/ is missing): it is not a "
            "complete checkpoint written by this version of filterax.checkpoint."
        ) from None
    files: dict[str, tuple[int, tuple[int, ...]]] = {}
    for name in names:
        if not name.endswith(".json"):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path, "rb") as file:
                record = json.loads(file.read())
            listed = record["files"]
            if not isinstance(listed, dict) or record["check"] != _check_of(listed):
                raise ValueError("its own check does not match")
            for relative, (size, crcs) in listed.items():
                files[relative] = (int(size), tuple(int(crc) for crc in crcs))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
            raise SerialisationError(
                f"{where}: the checksum file {path} is damaged ({error})."
            ) from None
    if not files:
        raise SerialisationError(f"{where}: {directory} lists no files.")
    return files


def _problem(path: str, size: int, start: int, crc: int) -> str | None:
    """What is wrong with the block of the file at `path` from `start`, if
    anything."""
    try:
        actual = os.path.getsize(path)
        if actual != size:
            return f"it has {actual} bytes, {size} were written"
        count, found = _block_crc(path, start, min(_BLOCK, size - start))
    except FileNotFoundError:
        return "it is missing"
    except OSError as error:
        return f"it cannot be read ({error})"
    if found != crc or count != min(_BLOCK, size - start):
        end = start + min(_BLOCK, size - start)
        return (
            "its checksum does not match what was written (its data changed, "
            f"in bytes {start} to {end})"
        )
    return None


def verify(
    checkpoint: str,
    files: dict[str, tuple[int, tuple[int, ...]]],
    where: str,
    holds: Callable[[str], str],
) -> None:
    """Checks `files` of the checkpoint, block by block in several threads;
    raises for the first damaged one, saying what it holds (`holds(relative
    path)`)."""
    jobs = [
        (relative, index * _BLOCK, crc)
        for relative in sorted(files)
        for index, crc in enumerate(files[relative][1])
    ]

    def check(job: tuple[str, int, int]) -> str | None:
        relative, start, crc = job
        size = files[relative][0]
        return _problem(os.path.join(checkpoint, relative), size, start, crc)

    with _pool() as pool:
        problems = list(pool.map(check, jobs))
    for (relative, _, _), problem in zip(jobs, problems):
        if problem is not None:
            path = os.path.join(checkpoint, relative)
            raise SerialisationError(
                f"{where} is damaged: the file {path} ({holds(relative)}) fails "
                f"its check: {problem}."
            )
