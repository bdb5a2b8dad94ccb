"""Fixtures for the checkpoint tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import orbax.checkpoint as ocp
import pytest


@pytest.fixture
def held_writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Holds back the completion of every checkpoint write until the returned
    event is set (at the latest when the test ends), so that a test can look
    at a save while it is certainly still in flight.

    The hold sits in the write of the JSON description, one of the items
    orbax commits in its background thread: a checkpoint is finalised only
    once every item is written."""
    release = threading.Event()
    original = ocp.JsonCheckpointHandler._save_fn

    async def held(self: Any, item: Any, directory: Any) -> None:
        release.wait()
        await original(self, item, directory)

    monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", held)
    try:
        yield release
    finally:
        release.set()
