"""`Source`: the binary stream a checkpoint is read from, with the checks that
every reader of it needs.

Sizes read from a file are only claims: a corrupted or crafted file may claim
any length. When the stream can tell how many bytes remain (it is seekable),
every claim is checked against that before anything is allocated for it;
when it cannot (a pipe, a socket), data is read in bounded chunks, so memory
grows only with the bytes that actually arrive.
"""

from __future__ import annotations

import io
import os
from typing import IO

from ._messages import SerialisationError

__all__ = ["CHUNK", "Source", "file_label"]

# Data moves in chunks: a checksum is taken while the chunk is still in cache,
# and a stream of unknown length never makes the reader allocate more than
# one chunk beyond what it delivered.
CHUNK = 1 << 22


def file_label(file: object) -> str:
    """How a file object is named in error messages: its name, or its type."""
    name = getattr(file, "name", None)
    return repr(name) if isinstance(name, str) else f"<{type(file).__name__}>"


def _is_seekable(stream: IO[bytes]) -> bool:
    try:
        if not stream.seekable():
            return False
        stream.tell()
    except (AttributeError, OSError, ValueError):
        return False
    return True


class Source:
    """A binary stream read from front to back.

    `name` describes the stream in error messages. `remaining` is the number
    of bytes left after the current position, or `None` when the stream
    cannot tell.
    """

    def __init__(self, stream: IO[bytes], name: str):
        self.stream = stream
        self.name = name
        self.seekable = _is_seekable(stream)
        self._readinto = getattr(stream, "readinto", None)
        self._pushback = b""  # bytes peeked from a stream that cannot seek back
        self.remaining: int | None = None
        if self.seekable:
            here = stream.tell()
            end = stream.seek(0, os.SEEK_END)
            stream.seek(here)
            self.remaining = max(end - here, 0)

    def fail(self, message: str) -> SerialisationError:
        return SerialisationError(f"{self.name}: {message}")

    def _raw_read_into(self, view: memoryview) -> int:
        if self._pushback:
            count = min(len(view), len(self._pushback))
            view[:count] = self._pushback[:count]
            self._pushback = self._pushback[count:]
            return count
        if self._readinto is not None:
            got = self._readinto(view)
        else:
            chunk = self.stream.read(len(view))
            got = None if chunk is None else len(chunk)
            if chunk:
                view[: len(chunk)] = chunk
        if got is None:  # a non-blocking raw stream with nothing to give
            raise BlockingIOError("the file object would block")
        return got

    def read_some_into(self, view: memoryview) -> int:
        """Reads at most `len(view)` bytes; returns how many (0 at the end)."""
        got = self._raw_read_into(view)
        if self.remaining is not None:
            self.remaining = max(self.remaining - got, 0)
        return got

    def read_upto_into(self, view: memoryview) -> int:
        """Fills `view` as far as the stream allows; returns how many bytes."""
        filled = 0
        while filled < len(view):
            got = self.read_some_into(view[filled:])
            if not got:
                break
            filled += got
        return filled

    def peek(self, size: int) -> bytes:
        """Up to `size` bytes from the current position, left unread."""
        buffer = bytearray(size)
        got = self.read_upto_into(memoryview(buffer))
        data = bytes(buffer[:got])
        if self.seekable:
            self.stream.seek(-got, os.SEEK_CUR)
        else:
            self._pushback = data + self._pushback
        if self.remaining is not None:
            self.remaining += got
        return data

    def at_end(self) -> bool:
        return self.peek(1) == b""

    def can_allocate(self, size: int) -> bool:
        """Whether a buffer of `size` bytes may be allocated before reading
        them: the size was checked against the stream, or is small anyway."""
        return self.remaining is not None or size <= CHUNK

    def require(self, size: int, what: str) -> None:
        """Fails unless at least `size` more bytes may be in the stream."""
        if self.remaining is not None and size > self.remaining:
            raise self.fail(
                f"file is truncated or corrupted: {what} needs {size} bytes, "
                f"but only {self.remaining} remain in the file."
            )

    def read_exact_into(self, view: memoryview, what: str) -> None:
        self.require(len(view), what)
        filled = self.read_upto_into(view)
        if filled < len(view):
            raise self.fail(
                f"file is truncated: it ends inside {what} "
                f"({filled} of {len(view)} bytes present)."
            )

    def read_exact(self, size: int, what: str) -> bytearray:
        """Exactly `size` bytes. Allocated as they arrive when the stream's
        length is unknown, so a false size costs no more than the file holds."""
        self.require(size, what)
        if self.can_allocate(size):
            buffer = bytearray(size)
            self.read_exact_into(memoryview(buffer), what)
            return buffer
        buffer = bytearray()
        while len(buffer) < size:
            part = bytearray(min(CHUNK, size - len(buffer)))
            got = self.read_upto_into(memoryview(part))
            buffer += memoryview(part)[:got]
            if got < len(part):
                raise self.fail(
                    f"file is truncated: it ends inside {what} ({len(buffer)} of "
                    f"{size} bytes present)."
                )
        return buffer

    def skip(self, size: int, what: str) -> None:
        """Moves `size` bytes ahead without looking at them."""
        self.require(size, what)
        if self.seekable and not self._pushback:
            self.stream.seek(size, os.SEEK_CUR)
            if self.remaining is not None:
                self.remaining -= size
            return
        scratch = memoryview(bytearray(min(size, CHUNK)))
        while size:
            step = min(size, len(scratch))
            self.read_exact_into(scratch[:step], what)
            size -= step

    # Used by the file objects handed to `filter_spec` callables, which may
    # move around within a seekable stream (as `numpy.load` does).

    def tell(self) -> int:
        return self.stream.tell() - len(self._pushback)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if not self.seekable:
            raise io.UnsupportedOperation("the checkpoint's stream cannot seek")
        position = self.stream.seek(offset, whence)
        end = self.stream.seek(0, os.SEEK_END)
        self.stream.seek(position)
        self.remaining = max(end - position, 0)
        return position
