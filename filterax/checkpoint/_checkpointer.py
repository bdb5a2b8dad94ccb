"""`Checkpointer`: numbered steps in one directory, saved asynchronously, on
orbax's `CheckpointManager`."""

from __future__ import annotations

import atexit
import operator
import os
import re
import shutil
import uuid
import weakref
from types import TracebackType
from typing import Any

import jax
import numpy as np

from ._api import PathLike, absolute, restore_from
from ._items import save_args
from ._lock import DELETING, Claim, claim
from ._processes import agree, next_save_number
from ._write import Write, staging_path

__all__ = ["Checkpointer"]

_STEP = re.compile(r"[0-9]+")
_OPEN: weakref.WeakSet[Checkpointer] = weakref.WeakSet()


def complete_steps(directory: str) -> list[int]:
    """The complete steps in `directory`, read from the directory itself: a
    step's directory has its number as its name only once complete."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(name) for name in names if _STEP.fullmatch(name))


class Checkpointer:
    """Saves a training run's state every few steps, asynchronously, keeping
    the newest ones; restores the latest complete one to resume.

    Each step is one checkpoint, as [`save`][filterax.checkpoint.save] writes
    it, in the subdirectory `<directory>/<step>`. A save returns once the
    arrays have been copied off the devices, and the write (and the checksums
    of its files) goes on in the background while training continues. A step
    is visible (in `steps()`, `latest_step()`, to `restore`) only once it is
    complete on every process, to this `Checkpointer` and to any other, in any
    process, which reads the directory afresh on every call: an evaluation
    process can follow a training run with one `Checkpointer` kept open.

    One writer at a time: the first `save` claims the directory (the file
    `filterax.writer` names the process), and a second writer's first `save`
    raises while the first lives. Readers never claim it and never remove
    anything. A writer killed mid-save leaves the previous steps restorable and
    the partial one invisible; the next writer removes it. Host memory stays
    bounded: at most one save is in flight, so a new save first waits for the
    previous one. A save still in flight when the program ends is finished
    before it exits. In a multi-process run every process creates the
    `Checkpointer` and makes the same calls; each `save` first checks that
    every process saves the same step of the same tree.

    Use it as a context manager, or call `close()`, which waits for the save
    in flight and gives up the claim.

    **Arguments:**

    - `directory`: where the steps live (`str` or `os.PathLike`); created if
      missing. On several hosts it must be on a filesystem they share.
    - `keep`: how many of the newest complete steps to keep (older ones are
      deleted once a newer one is complete); `None` keeps them all.

    **Returns:** a `Checkpointer`, with `save(step, tree, *, wait=False)`,
    `wait()`, `steps()`, `latest_step()`, `restore(like, step=None)` and
    `close()`.

    **Raises:** `ValueError` when `keep` is not a positive integer or `None`.

    ```python
    >>> import tempfile
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> import filterax.checkpoint
    >>> params = {"w": jnp.zeros(3)}
    >>> with fx.checkpoint.Checkpointer(tempfile.mkdtemp(), keep=2) as checkpoints:
    ...     for step in range(1, 5):
    ...         params = {"w": params["w"] + 1}  # a training step
    ...         checkpoints.save(step, params)  # returns while it writes
    ...     checkpoints.wait()
    ...     print(checkpoints.steps(), checkpoints.latest_step())
    ...     print(checkpoints.restore({"w": jnp.zeros(3)}))
    [3, 4] 4
    {'w': Array([4., 4., 4.], dtype=float32)}

    ```
    """

    def __init__(self, directory: PathLike, *, keep: int | None = None):
        if keep is not None and (
            isinstance(keep, bool) or not isinstance(keep, int) or keep < 1
        ):
            raise ValueError(f"keep must be a positive int or None, not {keep!r}.")
        self.directory = absolute(directory)
        self.keep = keep
        os.makedirs(self.directory, exist_ok=True)
        self._open = True
        self._claim: Claim | None = None
        self._token: str | None = None  # the primary process's, once agreed
        self._write: Write | None = None
        self._last_step: int | None = None  # the newest step this writer saved
        _OPEN.add(self)

    def _check_open(self) -> None:
        if not self._open:
            raise ValueError(f"this Checkpointer of {self.directory} is closed.")

    def save(self, step: int, tree: Any, *, wait: bool = False) -> None:
        """Saves `tree` as step `step`.

        **Arguments:**

        - `step`: the step number, a non-negative `int` (not a `bool`) greater
          than every step saved so far in the directory.
        - `tree`: the pytree to save (anything
          [`save`][filterax.checkpoint.save] takes).
        - `wait`: `False` (the default) returns once the arrays have been
          copied off the devices, and writes in the background; `True`
          returns once the step is complete.

        **Returns:** `None`.

        **Raises:** `TypeError` when `step` is not an `int`; `ValueError` when
        it is negative or not after the latest step; `RuntimeError` naming the
        writer that holds the directory when another does; what
        [`save`][filterax.checkpoint.save] raises for a leaf that cannot be
        saved, or for processes that disagree (nothing is written then); what
        the previous save raised, if it failed.

        ```python
        >>> import tempfile
        >>> import jax.numpy as jnp
        >>> import filterax.checkpoint
        >>> with filterax.checkpoint.Checkpointer(tempfile.mkdtemp()) as checkpoints:
        ...     checkpoints.save(10, {"w": jnp.ones(2)}, wait=True)
        ...     checkpoints.steps()
        [10]

        ```
        """
        self._check_open()
        try:
            if isinstance(step, (bool, np.bool_)):
                raise TypeError
            step = operator.index(step)
        except TypeError:
            raise TypeError(
                f"step must be an int, not {type(step).__name__} ({step!r})."
            ) from None
        if step < 0:
            raise ValueError(f"step must be non-negative, not {step}.")
        self.wait()  # one save in flight at a time
        args, described = save_args(tree)  # every leaf checked before writing
        number = next_save_number()
        refusal = None
        if jax.process_index() == 0:
            refusal = self._claim_directory()
            if refusal is None:
                latest = max([*complete_steps(self.directory), self._last_step or -1])
                if step <= latest:
                    refusal = (
                        f"cannot save step {step} in {self.directory}: step "
                        f"{latest} is already saved there, and steps must increase."
                    )
        if refusal is not None and jax.process_count() == 1:
            kind = RuntimeError if "being written" in refusal else ValueError
            raise kind(refusal)
        token = agree(
            number,
            self.directory,
            step,
            described.records,
            self._token or uuid.uuid4().hex[:16],
            refusal,
        )
        self._token = token
        target = os.path.join(self.directory, str(step))
        self._last_step = step
        self._write = Write(
            target,
            staging_path(target, f"{token}-{number}"),
            args,
            number,
            asynchronous=not wait,
            on_complete=self._prune if jax.process_index() == 0 else None,
        )
        if wait:
            self._write = None

    def _claim_directory(self) -> str | None:
        """Claims the directory (primary process), or says why not."""
        if self._claim is None:
            try:
                self._claim = claim(self.directory)
            except RuntimeError as error:
                return str(error)
            self._token = self._claim.token
        return None

    def _prune(self) -> None:
        """Deletes the oldest complete steps beyond `keep` (after a newer step
        is complete): each vanishes from the listing at once, by a rename."""
        if self.keep is None:
            return
        steps = complete_steps(self.directory)
        for step in steps[: max(len(steps) - self.keep, 0)]:
            doomed = os.path.join(
                self.directory, f"{step}{DELETING}{uuid.uuid4().hex[:8]}"
            )
            try:
                os.rename(os.path.join(self.directory, str(step)), doomed)
            except FileNotFoundError:
                continue
            shutil.rmtree(doomed, ignore_errors=True)

    def wait(self) -> None:
        """Blocks until the save in flight (if any) is complete on every
        process, raising what it raised if it failed.

        **Arguments:** none.

        **Returns:** `None`.

        ```python
        >>> import tempfile
        >>> import jax.numpy as jnp
        >>> import filterax.checkpoint
        >>> with filterax.checkpoint.Checkpointer(tempfile.mkdtemp()) as checkpoints:
        ...     checkpoints.save(1, {"w": jnp.ones(2)})
        ...     checkpoints.wait()
        ...     checkpoints.latest_step()
        1

        ```
        """
        write, self._write = self._write, None
        if write is not None:
            write.wait()

    def steps(self) -> list[int]:
        """The complete steps in the directory, oldest first, as the directory
        holds them now (steps other processes complete included).

        **Arguments:** none.

        **Returns:** a sorted `list` of `int`s (steps still being written are
        not in it).

        ```python
        >>> import tempfile
        >>> import jax.numpy as jnp
        >>> import filterax.checkpoint
        >>> with filterax.checkpoint.Checkpointer(tempfile.mkdtemp()) as checkpoints:
        ...     for step in (1, 5):
        ...         checkpoints.save(step, jnp.ones(2), wait=True)
        ...     checkpoints.steps()
        [1, 5]

        ```
        """
        self._check_open()
        return complete_steps(self.directory)

    def latest_step(self) -> int | None:
        """The newest complete step, or `None` when there is none.

        **Arguments:** none.

        **Returns:** an `int` or `None`.

        ```python
        >>> import tempfile
        >>> import filterax.checkpoint
        >>> with filterax.checkpoint.Checkpointer(tempfile.mkdtemp()) as checkpoints:
        ...     print(checkpoints.latest_step())
        None

        ```
        """
        steps = self.steps()
        return steps[-1] if steps else None

    def restore(self, like: Any, step: int | None = None) -> Any:
        """Restores step `step` (the latest complete one by default) into a
        pytree like `like`, as [`restore`][filterax.checkpoint.restore] does:
        onto `like`'s shardings, after checking that it matches `like`, and
        every file against its checksum.

        **Arguments:**

        - `like`: a pytree like the one saved, concrete or abstract.
        - `step`: the step to restore; `None` for the latest complete one.

        **Returns:** a new pytree like `like`, holding the saved values.

        **Raises:** `FileNotFoundError` when the step (or, for `None`, any
        step) is not in the directory; what
        [`restore`][filterax.checkpoint.restore] raises.

        ```python
        >>> import tempfile
        >>> import jax.numpy as jnp
        >>> import filterax.checkpoint
        >>> with filterax.checkpoint.Checkpointer(tempfile.mkdtemp()) as checkpoints:
        ...     checkpoints.save(1, {"w": jnp.ones(2)}, wait=True)
        ...     checkpoints.restore({"w": jnp.zeros(2)}, step=1)
        {'w': Array([1., 1.], dtype=float32)}

        ```
        """
        steps = self.steps()
        if step is None:
            if not steps:
                raise FileNotFoundError(f"no complete step in {self.directory}.")
            step = steps[-1]
        elif step not in steps:
            raise FileNotFoundError(
                f"step {step} is not in {self.directory} (complete steps: {steps})."
            )
        where = f"{self.directory}, step {step}"
        return restore_from(os.path.join(self.directory, str(step)), like, where)

    def close(self) -> None:
        """Waits for the save in flight, then gives up the claim on the
        directory. Calling it again does nothing.

        **Arguments:** none.

        **Returns:** `None`.

        ```python
        >>> import tempfile
        >>> import filterax.checkpoint
        >>> checkpoints = filterax.checkpoint.Checkpointer(tempfile.mkdtemp())
        >>> checkpoints.close()
        >>> checkpoints.close()

        ```
        """
        if not self._open:
            return
        try:
            self.wait()
        finally:
            self._open = False
            _OPEN.discard(self)
            if self._claim is not None:
                self._claim.release()
                self._claim = None

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Checkpointer({self.directory!r}, keep={self.keep!r})"


def _release_at_exit() -> None:
    # The saves in flight have finished by now (their threads are joined
    # before exit handlers run; `_write`'s handler reports a failure).
    for checkpointer in list(_OPEN):
        if checkpointer._claim is not None:
            checkpointer._claim.release()
            checkpointer._claim = None


atexit.register(_release_at_exit)
