"""Files for `tree_serialise_leaves`: which file a path names, output to paths
(atomically, see `_atomic.py`) or file objects, input from either, and the
per-leaf file objects filterax's format gives `filter_spec` callables."""

from __future__ import annotations

import contextlib
import errno
import io
import os
from collections.abc import Callable, Iterator
from typing import IO, Any, BinaryIO

from ._atomic import atomic_output
from ._framing import EntryMeta, FormatReader, FormatWriter
from ._kinds import RAW
from ._messages import SerialisationError
from ._source import Source, file_label

__all__ = [
    "LeafReader",
    "LeafWriter",
    "PathOrFile",
    "open_input",
    "open_output",
]

# A path, or a binary file object (any `io` stream: `open(..., "rb")`,
# `io.BytesIO`, a `RawIOBase` subclass; text files are rejected at run time).
PathOrFile = str | bytes | os.PathLike | BinaryIO | io.IOBase
KeyPath = tuple[Any, ...]

DEFAULT_SUFFIX = ".eqx"


class LeafWriter(io.RawIOBase):
    """The binary file a serialising `filter_spec` callable receives for one
    leaf. Bytes written to it become that leaf's `raw` entry (buffered in
    memory, as their length must precede them); `default_serialise_filter_spec`
    instead streams a typed entry straight to the file."""

    def __init__(self, writer: FormatWriter, path: str):
        super().__init__()
        self.path = path
        self._writer = writer
        self._raw = io.BytesIO()
        self._typed = False

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self._typed:
            raise SerialisationError(
                f"the filter_spec callable for {self.path} wrote bytes after "
                "calling default_serialise_filter_spec; each leaf holds one or "
                "the other."
            )
        return self._raw.write(data)

    def write_entry(self, meta: EntryMeta, data: bytes | memoryview) -> None:
        if self._typed or self._raw.tell():
            raise SerialisationError(
                f"the filter_spec callable for {self.path} saved the leaf twice "
                "(default_serialise_filter_spec after other output); each leaf "
                "holds one entry."
            )
        self._typed = True
        self._writer.write_entry(meta, data)

    def finish(self) -> None:
        if not self._typed:
            payload = self._raw.getbuffer()
            size = len(payload)
            self._writer.write_entry(
                EntryMeta(self.path, RAW, "uint8", (size,), size), payload
            )
            del payload  # release the export so the buffer can be freed


class LeafReader(io.RawIOBase):
    """The binary file a deserialising `filter_spec` callable receives for one
    leaf of a filterax checkpoint: its `raw` entry's bytes, or the handle
    `default_deserialise_filter_spec` reads a typed entry through. Read as a
    file, a typed entry gives the bytes `numpy.save` writes for its value
    (`as_npy(self)`), as Equinox's default stored it, so `numpy.load(f)` works.
    An entry the callable leaves unread is skipped."""

    def __init__(
        self,
        reader: FormatReader,
        meta: EntryMeta,
        key_path: KeyPath,
        as_npy: Callable[[LeafReader], bytes],
    ):
        super().__init__()
        self.meta = meta
        self.path = meta.path
        self.key_path = key_path
        self.format_reader = reader
        self._as_npy = as_npy
        self._raw: io.BytesIO | None = None
        self.consumed = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def _raw_bytes(self) -> io.BytesIO:
        if self._raw is None:
            if self.meta.kind == RAW:
                data = self.take(self.format_reader.read_data)
            else:
                data = self._as_npy(self)
            self._raw = io.BytesIO(data)
        return self._raw

    def take(self, read: Callable[[EntryMeta], Any]) -> Any:
        """Reads the entry's data once, with `read(meta)`."""
        if self.consumed:
            raise SerialisationError(f"entry {self.meta.path} was already read.")
        self.consumed = True
        return read(self.meta)

    def readinto(self, buffer: Any) -> int:
        return self._raw_bytes().readinto(buffer)

    def read(self, size: int | None = -1) -> bytes:
        return self._raw_bytes().read(size)

    def readline(self, size: int | None = -1) -> bytes:
        return self._raw_bytes().readline(size)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._raw_bytes().seek(offset, whence)

    def tell(self) -> int:
        return self._raw_bytes().tell()

    def finish(self) -> None:
        if not self.consumed:
            self.format_reader.skip_data(self.meta)


def with_default_suffix(path: str) -> str:
    """`path` with `.eqx` appended when its last component has no suffix (as
    `pathlib` sees it: `model` and `model.` have none, `.model` has none,
    `model.fx` has `.fx`), as Equinox does."""
    name = os.path.basename(path)
    if name in ("", ".", ".."):
        return path
    dot = name.rfind(".")
    return path if 0 < dot < len(name) - 1 else path + DEFAULT_SUFFIX


def _as_path(path_or_file: Any) -> str | None:
    if isinstance(path_or_file, (str, bytes, os.PathLike)):
        return with_default_suffix(os.fsdecode(os.fspath(path_or_file)))
    return None


def _check_binary_file(f: Any, method: str, mode: str) -> None:
    if isinstance(f, io.TextIOBase) or not hasattr(f, method):
        raise TypeError(
            f"path_or_file must be a path or a binary file object opened with "
            f"{mode!r}, not {type(f).__name__}."
        )


@contextlib.contextmanager
def open_output(path_or_file: PathOrFile) -> Iterator[IO[bytes]]:
    """Yields a stream to write a checkpoint to: for a path (given the `.eqx`
    suffix if it has none), atomically, through a temporary file; for a file
    object, the file itself, from its current position."""
    path = _as_path(path_or_file)
    if path is None:
        _check_binary_file(path_or_file, "write", "wb")
        yield path_or_file  # type: ignore[misc]
        with contextlib.suppress(AttributeError):
            path_or_file.flush()  # type: ignore[union-attr]
        return
    # Through a symlink, not over it: the link's target is replaced.
    with atomic_output(os.path.realpath(path)) as stream:
        yield stream


@contextlib.contextmanager
def open_input(path_or_file: PathOrFile) -> Iterator[Source]:
    """Yields the checkpoint's `Source`: the file at a path, or a file object
    from its current position."""
    path = _as_path(path_or_file)
    if path is None:
        _check_binary_file(path_or_file, "read", "rb")
        yield Source(path_or_file, file_label(path_or_file))  # type: ignore[arg-type]
        return
    try:
        stream = open(path, "rb")
    except FileNotFoundError:
        given = os.fsdecode(os.fspath(path_or_file))  # type: ignore[arg-type]
        if given != path and os.path.isfile(given):
            raise FileNotFoundError(
                errno.ENOENT,
                f"No such file (a path without a suffix gets {DEFAULT_SUFFIX!r} "
                f"appended, as in Equinox, but the file is at {given!r}: rename "
                "it, or open it and pass the file object)",
                path,
            ) from None
        raise
    with stream:
        yield Source(stream, repr(path))
