"""Fixtures shared by the serialisation tests."""

from __future__ import annotations

import io
from typing import Any

import pytest


class ReadOnlyStream(io.RawIOBase):
    """A stream that cannot seek or tell its length, like a pipe."""

    def __init__(self, data: bytes) -> None:
        self.inner = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self.inner.readinto(buffer)


@pytest.fixture
def read_only_stream() -> type[ReadOnlyStream]:
    """`read_only_stream(data)`: a readable stream of `data` that cannot seek."""
    return ReadOnlyStream
