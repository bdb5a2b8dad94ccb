"""filterax's own format, the one `tree_serialise_leaves` writes.

File format, version 1 (full specification in `docs/serialisation-format.md`;
all integers little-endian, every checksum a `zlib.crc32`):

    preamble  magic b"\\x89FLTRAX\\n", u32 format version, u32 flags (0)
    header    u64 length, JSON {"leaves": [keystr, ...]}, u32 checksum of
              preamble + length + JSON
    entries   one per leaf, in flattening order:
              u32 length, JSON {"path", "kind", "dtype", "shape", "nbytes",
              ["impl" | "type", "value"]}, u32 checksum of length + JSON,
              `nbytes` bytes of data, u32 checksum of the data
    footer    b"FLTRXEND", u64 entry count, u32 checksum

`kind` is the type tag: `jax_array`, `numpy_array`, `numpy_scalar`,
`key_array` (the key data, with the PRNG implementation in `impl`), `bool`,
`int`, `float`, `complex` (Python scalars), `object` (a non-array leaf, not
stored; its type name in `type`, its description in `value`, as
`filterax.checkpoint` describes static leaves) or `raw` (bytes written by a custom
`filter_spec` callable). Array data is C-ordered and little-endian.

The framing is `_framing.py`, a leaf's entry `_leaf.py`, the per-leaf file
objects `_io.py`, the matching of key paths `_key_paths.py`. Both directions
stream one leaf at a time: nothing holds the whole file.
"""

from __future__ import annotations

from typing import IO, Any, BinaryIO

from ._framing import MAGIC, FormatReader, FormatWriter
from ._io import LeafReader, LeafWriter
from ._key_paths import check_paths, subtree_at
from ._leaf import decode_leaf, encode_leaf, entry_as_npy
from ._registry import Format, Leaf
from ._source import Source

__all__ = ["FILTERAX", "FilteraxFormat"]


class FilteraxFormat(Format):
    """filterax's checkpoints: key paths, typed entries, checksums."""

    signature_length = len(MAGIC)

    def recognises(self, start: bytes, custom_first_leaf: bool) -> bool:
        # A file shorter than the magic that begins like it is a truncated
        # filterax checkpoint, and is reported as one.
        return bool(start) and start == MAGIC[: len(start)]

    def expected(self, start: bytes) -> str:
        return f"a filterax checkpoint (starts with {start!r}, expected {MAGIC!r})"

    def write(self, stream: IO[bytes], leaves: list[Leaf]) -> None:
        writer = FormatWriter(stream)
        writer.write_header([leaf.path for leaf in leaves])
        for leaf in leaves:
            handle = LeafWriter(writer, leaf.path)
            leaf.spec(handle, leaf.leaf)
            handle.finish()
        writer.write_footer()

    def read(self, source: Source, leaves: list[Leaf]) -> list[Any]:
        reader = FormatReader(source)
        stored = reader.read_header()
        wanted = [leaf.path for leaf in leaves]
        prefix, start = "", 0
        if stored != wanted:
            subtree = subtree_at(stored, wanted)
            if subtree is None:
                check_paths(source.name, stored, leaves)
            else:
                start, prefix = subtree
        for path in stored[:start]:
            reader.skip_data(reader.read_entry_meta(path))
        loaded = []
        for leaf in leaves:
            meta = reader.read_entry_meta(prefix + leaf.path)
            handle = LeafReader(reader, meta, leaf.key_path, entry_as_npy)
            loaded.append(leaf.spec(handle, leaf.leaf))
            handle.finish()
        for path in stored[start + len(leaves) :]:
            reader.skip_data(reader.read_entry_meta(path))
        reader.read_footer()
        return loaded

    def writes_leaf_to(self, file: Any) -> bool:
        return isinstance(file, LeafWriter)

    def reads_leaf_from(self, file: Any) -> bool:
        return isinstance(file, LeafReader)

    def save_leaf(self, file: BinaryIO, leaf: Any) -> None:
        assert isinstance(file, LeafWriter)  # see `writes_leaf_to`
        file.write_entry(*encode_leaf(file.path, leaf))

    def load_leaf(self, file: BinaryIO, like: Any) -> Any:
        assert isinstance(file, LeafReader)  # see `reads_leaf_from`
        return decode_leaf(file, like)


FILTERAX = FilteraxFormat()
