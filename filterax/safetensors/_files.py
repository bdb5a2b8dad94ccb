"""Safetensors files on disk: which files a path names (one file, or the
files of a multi-file checkpoint by its index), their headers read and
checked with errors that name the path, and atomic writes.

A safetensors file is an 8-byte little-endian header length, a JSON header
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{str: str}}`, then the tensor bytes. The header is read here (it is small),
so every name, shape and the file's completeness are known before any tensor
is read; the tensors themselves are read by `safetensors.safe_open`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import secrets
from collections.abc import Iterator

from .._serialisation import SerialisationError

__all__ = ["Checkpoint", "PathLike", "Stored", "atomic_path", "open_checkpoint"]

PathLike = str | os.PathLike[str]

INDEX_SUFFIX = ".safetensors.index.json"
_HEADER_LIMIT = 100 * 2**20  # safetensors' own limit on the JSON header


@dataclasses.dataclass(frozen=True)
class Stored:
    """A tensor as the header of its file describes it."""

    name: str
    file: str
    dtype: str  # safetensors' code: "F32", "BF16", ...
    shape: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """The tensors a path names, by name; `where` is the path, for messages."""

    where: str
    tensors: dict[str, Stored]
    metadata: dict[str, str]  # every file's metadata, merged


def _header(file: str) -> tuple[dict[str, Stored], dict[str, str]]:
    """The tensors and metadata of one safetensors file, checked to be
    complete; `SerialisationError` naming `file` otherwise."""
    size = os.path.getsize(file)
    with open(file, "rb") as stream:
        length_bytes = stream.read(8)
        if len(length_bytes) < 8:
            raise SerialisationError(
                f"{file} is not a safetensors file: it has {size} bytes, fewer "
                "than the 8 that give the length of a safetensors header."
            )
        length = int.from_bytes(length_bytes, "little")
        first = stream.read(1)
        if first != b"{" or length > _HEADER_LIMIT:
            raise SerialisationError(
                f"{file} is not a safetensors file: it does not start with the "
                "length of a JSON header followed by that header."
            )
        if 8 + length > size:
            raise SerialisationError(
                f"{file} is truncated: its header is {length} bytes long, but "
                f"the file ends after {size - 8} bytes of it."
            )
        text = first + stream.read(length - 1)
    try:
        header = json.loads(text)
        metadata = header.pop("__metadata__", None) or {}
        tensors = {
            name: Stored(name, file, entry["dtype"], tuple(entry["shape"]))
            for name, entry in header.items()
        }
        end = max((entry["data_offsets"][1] for entry in header.values()), default=0)
    except (ValueError, TypeError, KeyError, IndexError) as error:
        raise SerialisationError(
            f"{file} is not a safetensors file: its header is not a valid "
            f"safetensors header ({type(error).__name__}: {error})."
        ) from None
    if 8 + length + end > size:
        raise SerialisationError(
            f"{file} is truncated: its tensors need {end} bytes after the header, "
            f"but the file holds only {size - 8 - length}."
        )
    return tensors, metadata


def _from_index(index: str) -> Checkpoint:
    """The checkpoint an index file `{"metadata": ..., "weight_map": {name:
    file}}` describes, every file it names read and checked."""
    try:
        with open(index, encoding="utf-8") as stream:
            content = json.load(stream)
        weight_map = content["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (ValueError, TypeError, KeyError) as error:
        raise SerialisationError(
            f"{index} is not a safetensors index: it must be JSON holding a "
            f'"weight_map" object from tensor names to file names '
            f"({type(error).__name__}: {error})."
        ) from None
    directory = os.path.dirname(index)
    headers: dict[str, tuple[dict[str, Stored], dict[str, str]]] = {}
    for file in sorted(set(weight_map.values())):
        path = os.path.join(directory, file)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"the index {index} names the file {file!r}, which does not "
                f"exist ({path})."
            )
        headers[file] = _header(path)
    tensors = {}
    for name, file in weight_map.items():
        in_file = headers[file][0]
        if name not in in_file:
            raise SerialisationError(
                f"the index {index} puts the tensor {name!r} in {file}, which "
                "holds no tensor of that name."
            )
        tensors[name] = in_file[name]
    metadata: dict[str, str] = {}
    for _, file_metadata in headers.values():
        metadata.update(file_metadata)
    return Checkpoint(index, tensors, metadata)


def _in_directory(directory: str) -> str:
    """The index, or the single file, of the checkpoint in `directory`."""
    for pattern in (f"*{INDEX_SUFFIX}", "*.safetensors"):
        found = sorted(glob.glob(os.path.join(glob.escape(directory), pattern)))
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            names = ", ".join(os.path.basename(path) for path in found)
            raise SerialisationError(
                f"{directory} holds several {pattern[1:]} files ({names}) and "
                "no single index: pass the path of the one to load."
            )
    raise FileNotFoundError(
        f"{directory} holds no safetensors checkpoint: no *.safetensors file "
        f"and no *{INDEX_SUFFIX} index."
    )


def open_checkpoint(path: PathLike) -> Checkpoint:
    """The tensors named by `path`: a safetensors file, an index file, or a
    directory holding one of them."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"path must be a str or os.PathLike, not {type(path).__name__}."
        )
    where = os.fspath(path)
    if os.path.isdir(where):
        where = _in_directory(where)
    if not os.path.isfile(where):
        raise FileNotFoundError(f"no safetensors checkpoint at {where}: no such file.")
    if where.endswith(".json"):
        return _from_index(where)
    tensors, metadata = _header(where)
    return Checkpoint(where, tensors, metadata)


@contextlib.contextmanager
def atomic_path(target: str) -> Iterator[str]:
    """Yields a temporary path beside `target` to write to; once the block
    ends, the file written there is flushed to disk and renamed over
    `target`. If the block raises, the temporary file is removed and `target`
    is left as it was."""
    directory, base = os.path.split(os.path.abspath(target))
    temporary = os.path.join(directory, f".{base}.{secrets.token_hex(6)}.tmp")
    try:
        yield temporary
        with open(temporary, "rb+") as stream:
            os.fsync(stream.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    # Make the rename itself durable; not possible on every platform.
    with contextlib.suppress(OSError):
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
