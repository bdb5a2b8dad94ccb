"""The registry of serialisation formats: what a format declares, and how the
reader and the writer find the format to use.

A format says how it recognises its input (the first bytes of a checkpoint,
or the file object a `filter_spec` callable is given) and its output (the file
object a callable is given), and how it writes and reads: a whole checkpoint
(`write`, `read`) and one leaf (`save_leaf`, `load_leaf`). It overrides only
what it supports. The formats themselves are registered in `_formats.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import IO, Any, BinaryIO, NamedTuple

from ._source import Source

__all__ = ["Format", "Leaf", "Registry"]


class Leaf(NamedTuple):
    """One leaf of the pytree being saved, or of `like` when loading."""

    path: str  # `jax.tree_util.keystr` of `key_path`
    key_path: tuple[Any, ...]
    spec: Callable  # the `filter_spec` callable that covers the leaf
    leaf: Any


class Format:
    """One serialisation format. Every method has a "not this format" or
    "not supported" default."""

    # How many first bytes of a checkpoint `recognises` looks at.
    signature_length = 0

    def recognises(self, start: bytes, custom_first_leaf: bool) -> bool:
        """Whether a checkpoint starting with `start` (at most
        `signature_length` bytes; fewer at the end of the file) is in this
        format. `custom_first_leaf`: the first leaf is read by a custom
        `filter_spec` callable, which may have written any bytes."""
        return False

    def expected(self, start: bytes) -> str | None:
        """What a checkpoint in this format starts with, as a phrase of the
        error for a file no format recognises ("not <phrase>, nor <phrase>");
        `None` for a format that is not read as a whole checkpoint."""
        return None

    def write(self, stream: IO[bytes], leaves: list[Leaf]) -> None:
        """Writes a whole checkpoint of `leaves` to `stream`."""
        raise NotImplementedError(f"{type(self).__name__} writes no checkpoints")

    def read(self, source: Source, leaves: list[Leaf]) -> list[Any]:
        """Reads a whole checkpoint into leaves like those of `leaves`."""
        raise NotImplementedError(f"{type(self).__name__} reads no checkpoints")

    def writes_leaf_to(self, file: Any) -> bool:
        """Whether `file`, given to a saving `filter_spec` callable, takes
        this format's leaves."""
        return False

    def reads_leaf_from(self, file: Any) -> bool:
        """Whether `file`, given to a loading `filter_spec` callable, holds a
        leaf in this format."""
        return False

    def save_leaf(self, file: BinaryIO, leaf: Any) -> None:
        """What `default_serialise_filter_spec` does with `file`."""
        raise NotImplementedError(f"{type(self).__name__} saves no leaves")

    def load_leaf(self, file: BinaryIO, like: Any) -> Any:
        """What `default_deserialise_filter_spec` does with `file`."""
        raise NotImplementedError(f"{type(self).__name__} loads no leaves")


class Registry:
    """The formats, in the order they are tried, and the one that
    `tree_serialise_leaves` writes.

    A format overrides what it supports; the registry finds it by its input:

    ```python
    >>> import io
    >>> from filterax._serialisation._registry import Format, Registry
    >>> from filterax._serialisation._source import Source
    >>> class Lines(Format):  # one leaf per line of text
    ...     signature_length = 5
    ...     def recognises(self, start, custom_first_leaf):
    ...         return start == b"LINES"
    ...     def expected(self, start):
    ...         return f"a text file (starts with {start!r}, expected b'LINES')"
    ...     def read(self, source, leaves):
    ...         return source.stream.read().decode().split()[1:]
    >>> lines = Lines()
    >>> registry = Registry(lines, written=lines)
    >>> source = Source(io.BytesIO(b"LINES a b"), "<text>")
    >>> registry.input_format(source, custom_first_leaf=False).read(source, [])
    ['a', 'b']
    >>> registry.input_format(Source(io.BytesIO(b"other"), "<text>"), False)
    Traceback (most recent call last):
    ...
    filterax.SerialisationError: <text>: not a text file (starts with b'other', expected b'LINES'); was it written by `tree_serialise_leaves`?

    ```
    """

    def __init__(self, *formats: Format, written: Format):
        if written not in formats:
            raise ValueError("the written format must be one of the formats")
        self.formats = formats
        self.written = written
        self._signature_length = max(f.signature_length for f in formats)

    def input_format(self, source: Source, custom_first_leaf: bool) -> Format:
        """The format of the checkpoint that `source` holds, told by its
        first bytes (left unread)."""
        start = source.peek(self._signature_length)
        for candidate in self.formats:
            if candidate.recognises(start, custom_first_leaf):
                return candidate
        phrases = [p for f in self.formats if (p := f.expected(start)) is not None]
        raise source.fail(
            f"not {', nor '.join(phrases)}; was it written by `tree_serialise_leaves`?"
        )

    def leaf_output_format(self, file: Any) -> Format:
        """The format that saves a leaf to `file`."""
        for candidate in self.formats:
            if candidate.writes_leaf_to(file):
                return candidate
        raise TypeError(f"no serialisation format saves a leaf to {file!r}")

    def leaf_input_format(self, file: Any) -> Format:
        """The format that loads a leaf from `file`."""
        for candidate in self.formats:
            if candidate.reads_leaf_from(file):
                return candidate
        raise TypeError(f"no serialisation format loads a leaf from {file!r}")
