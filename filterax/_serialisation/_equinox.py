"""Equinox's format: the files of Equinox's `tree_serialise_leaves`.

Such a file has no header and no key paths: it is NumPy `.npy` records one
after another, one per array or Python-scalar leaf of the saved pytree in its
flattening order (`_npy.py` reads the records, `_npy_leaf.py` restores leaves
from them). It is recognised by its first bytes and read in the order of
`like`'s leaves; filterax reads it but does not write it.
"""

from __future__ import annotations

from typing import Any, BinaryIO

from ._npy import NPY_MAGIC, NpyReader, starts_npy_record
from ._npy_leaf import NpyLeafReader, decode_npy_leaf
from ._registry import Format, Leaf
from ._source import Source

__all__ = ["EQUINOX", "EquinoxFormat"]


class EquinoxFormat(Format):
    """Equinox's checkpoints: `.npy` records in the order of the leaves."""

    signature_length = len(NPY_MAGIC) + 2  # the magic and the version

    def recognises(self, start: bytes, custom_first_leaf: bool) -> bool:
        # An empty file holds a pytree without arrays; a custom `filter_spec`
        # may have written any bytes, the first leaf's too.
        return not start or starts_npy_record(start) or custom_first_leaf

    def expected(self, start: bytes) -> str:
        return f"an Equinox one (NumPy records, starting with {NPY_MAGIC!r})"

    def read(self, source: Source, leaves: list[Leaf]) -> list[Any]:
        # Records after `like`'s last leaf are left unread, as Equinox leaves
        # them: the model alone loads from a `(model, opt_state)` checkpoint.
        reader = NpyReader(source)
        return [
            leaf.spec(NpyLeafReader(reader, leaf.path, leaf.key_path), leaf.leaf)
            for leaf in leaves
        ]

    def reads_leaf_from(self, file: Any) -> bool:
        return isinstance(file, NpyLeafReader)

    def load_leaf(self, file: BinaryIO, like: Any) -> Any:
        assert isinstance(file, NpyLeafReader)  # see `reads_leaf_from`
        return decode_npy_leaf(file, like)


EQUINOX = EquinoxFormat()
