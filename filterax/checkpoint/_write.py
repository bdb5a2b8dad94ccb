"""One save, from the arguments orbax takes to a complete checkpoint.

Orbax writes the checkpoint to `<target>.filterax-tmp-<token>` (itself going
through a temporary directory of its own). Once orbax is done on every
process, each process sums the files it wrote (`_integrity.py`), and the
primary process renames the directory to `<target>`: a checkpoint appears
under its name only once complete, with its checksums, on every process.
The checksums are computed in the background thread of an asynchronous save.
A save that fails removes its partial directory.

A save still in flight when the interpreter exits is finished first; if it
fails then, the process exits with status 1 after printing why.

Imports `jax`, `orbax.checkpoint` and the checkpoint's own modules.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import threading
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import jax
import orbax.checkpoint as ocp

from ._integrity import write_checksums
from ._lock import TEMPORARY
from ._processes import barrier

__all__ = ["Write", "remove_own_partial", "staging_path"]

_IN_FLIGHT: weakref.WeakSet[Write] = weakref.WeakSet()


def staging_path(target: str, token: str) -> str:
    return f"{target}{TEMPORARY}{token}"


def remove_own_partial(staging: str) -> None:
    """Removes the partial directory of one save (and orbax's own, beside it)."""
    parent, name = os.path.split(staging)
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return
    for other in names:
        if other == name or other.startswith(f"{name}."):
            shutil.rmtree(os.path.join(parent, other), ignore_errors=True)


class Write:
    """A save in progress: orbax's writer, then the checksums and the rename,
    in a thread when asynchronous."""

    def __init__(
        self,
        target: str,
        staging: str,
        args: Any,
        number: int,
        *,
        asynchronous: bool,
        on_complete: Callable[[], None] | None = None,
    ):
        self.target = target
        self._staging = staging
        self._number = number
        self._on_complete = on_complete
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        primary = jax.process_index() == 0
        # Orbax's asynchronous writer either way (for `wait=True` too: its
        # thread pools write faster than its synchronous writer).
        checkpointer = ocp.AsyncCheckpointer(ocp.CompositeCheckpointHandler())
        try:
            # Returns once the arrays are copied off the devices.
            checkpointer.save(staging, args=args)
        except BaseException:
            checkpointer.close()
            if primary:
                remove_own_partial(staging)
            raise
        if asynchronous:
            self._thread = threading.Thread(
                target=self._finish,
                args=(checkpointer,),
                name=f"filterax.checkpoint {target}",
            )
            _IN_FLIGHT.add(self)
            self._thread.start()
        else:
            self._finish(checkpointer)
            self._raise()

    def _finish(self, checkpointer: ocp.AsyncCheckpointer) -> None:
        primary = jax.process_index() == 0
        try:
            try:
                try:
                    checkpointer.wait_until_finished()
                finally:
                    checkpointer.close()
                write_checksums(self._staging, jax.process_index())
            except BaseException as error:
                # The other processes learn of it at once, not by waiting.
                barrier(self._number, "summed", self.target, _in_words(error))
                raise
            barrier(self._number, "summed", self.target)
            if primary:
                try:
                    os.rename(self._staging, self.target)
                    # Before the others go on: they see what it leaves.
                    if self._on_complete is not None:
                        self._on_complete()
                except BaseException as error:
                    barrier(self._number, "renamed", self.target, _in_words(error))
                    raise
            barrier(self._number, "renamed", self.target)
        except BaseException as error:
            self._error = error
            if primary:
                remove_own_partial(self._staging)

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def wait(self) -> None:
        """Blocks until the save is complete; raises what it raised."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            _IN_FLIGHT.discard(self)
        self._raise()


def _in_words(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _finish_at_exit() -> None:
    for write in list(_IN_FLIGHT):
        try:
            write.wait()
        except BaseException:
            sys.stderr.write(
                f"filterax.checkpoint: the save of {write.target}, still in "
                "flight when the program ended, failed:\n" + traceback.format_exc()
            )
            sys.stderr.flush()
            os._exit(1)


# Run when the main thread ends, before the interpreter shuts down the thread
# pools orbax writes with (they refuse work from then on): the hooks
# `threading` runs then go last-registered first, and `concurrent.futures`
# registered its own when orbax imported it. Where `threading` has no such
# hook, at exit.
_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(_finish_at_exit)
else:  # pragma: no cover - CPython has had the hook since 3.9
    atexit.register(_finish_at_exit)
