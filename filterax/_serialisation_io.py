"""Files for `tree_serialise_leaves`: atomic output to paths, input from paths
or file objects, and the per-leaf file objects `filter_spec` callables receive."""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from typing import IO, Any, BinaryIO

from ._serialisation_format import (
    EntryMeta,
    FormatReader,
    FormatWriter,
    SerialisationError,
)

__all__ = [
    "LeafReader",
    "LeafWriter",
    "PathOrFile",
    "atomic_output",
    "leaf_handle",
    "open_input",
]

PathOrFile = str | os.PathLike | BinaryIO


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
                EntryMeta(self.path, "raw", "uint8", (size,), size), payload
            )
            del payload  # release the export so the buffer can be freed


class LeafReader(io.RawIOBase):
    """The binary file a deserialising `filter_spec` callable receives for one
    leaf: its `raw` entry's bytes, or the handle `default_deserialise_filter_spec`
    reads a typed entry through. An entry the callable leaves unread is skipped."""

    def __init__(self, reader: FormatReader, meta: EntryMeta):
        super().__init__()
        self.meta = meta
        self.format_reader = reader
        self._raw: io.BytesIO | None = None
        self.consumed = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self.meta.kind == "raw"

    def _raw_bytes(self) -> io.BytesIO:
        if self._raw is None:
            if self.meta.kind != "raw":
                raise SerialisationError(
                    f"{self.format_reader.name}: entry {self.meta.path} holds "
                    f"{self.meta.describe()}, saved by "
                    "default_serialise_filter_spec; read it with "
                    "default_deserialise_filter_spec, not as raw bytes."
                )
            self._raw = io.BytesIO(self.take(self.format_reader.read_data))
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


def leaf_handle(f: Any, cls: type, function: str) -> Any:
    if not isinstance(f, cls):
        raise TypeError(
            f"{function} must be given the file object that "
            f"{'tree_serialise_leaves' if cls is LeafWriter else 'tree_deserialise_leaves'} "
            f"passes to filter_spec callables, not {type(f).__name__}."
        )
    return f


def _as_path(path_or_file: Any) -> str | None:
    if isinstance(path_or_file, (str, bytes, os.PathLike)):
        return os.fsdecode(os.fspath(path_or_file))
    return None


def _check_binary_file(f: Any, method: str, mode: str) -> None:
    if isinstance(f, io.TextIOBase) or not hasattr(f, method):
        raise TypeError(
            f"path_or_file must be a path or a binary file object opened with "
            f"{mode!r}, not {type(f).__name__}."
        )


@contextlib.contextmanager
def atomic_output(path_or_file: PathOrFile) -> Iterator[IO[bytes]]:
    """Yields a stream to write to. For a path, the stream is a temporary file
    in the same directory that replaces the path only once it is complete and
    on disk, and is deleted if writing fails."""
    path = _as_path(path_or_file)
    if path is None:
        _check_binary_file(path_or_file, "write", "wb")
        yield path_or_file  # type: ignore[misc]
        with contextlib.suppress(AttributeError):
            path_or_file.flush()  # type: ignore[union-attr]
        return
    target = os.path.realpath(path)  # write through a symlink, not over it
    directory, base = os.path.split(target)
    temporary = os.path.join(directory, f".{base}.{secrets.token_hex(6)}.tmp")
    # 0o666 less the umask, like `open`; O_EXCL as the name must be new.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    descriptor = os.open(temporary, flags, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        with contextlib.suppress(FileNotFoundError):
            os.chmod(temporary, stat.S_IMODE(os.stat(target).st_mode))
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    # Make the rename itself durable; not possible on every platform.
    with contextlib.suppress(OSError):
        directory_descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(directory_descriptor)
        finally:
            os.close(directory_descriptor)


@contextlib.contextmanager
def open_input(path_or_file: PathOrFile) -> Iterator[tuple[IO[bytes], str]]:
    """Yields a stream to read from and a description of it for messages."""
    path = _as_path(path_or_file)
    if path is None:
        _check_binary_file(path_or_file, "read", "rb")
        name = getattr(path_or_file, "name", None)
        label = (
            repr(name) if isinstance(name, str) else f"<{type(path_or_file).__name__}>"
        )
        yield path_or_file, label  # type: ignore[misc]
        return
    with open(path, "rb") as stream:
        yield stream, repr(path)
