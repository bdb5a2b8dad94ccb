"""`Checkpointer`: numbered steps in one directory, saved asynchronously, on
orbax's `CheckpointManager`."""

from __future__ import annotations

import operator
import os
from types import TracebackType
from typing import Any

import orbax.checkpoint as ocp

from ._api import PathLike, absolute
from ._items import restore_tree, save_args

__all__ = ["Checkpointer"]


class Checkpointer:
    """Saves a training run's state every few steps, asynchronously, keeping
    the newest ones; restores the latest complete one to resume.

    Each step is one checkpoint, as [`save`][filterax.checkpoint.save] writes
    it, in the subdirectory `<directory>/<step>`. A save returns once the
    arrays have been copied off the devices, and the write goes on in the
    background while training continues. A step is visible (in `steps()`,
    `latest_step()`, to `restore`) only once it is complete on every process:
    a writer killed mid-save leaves the previous steps restorable and the
    partial one invisible (its temporary directory is removed the next time a
    `Checkpointer` opens the directory). Host memory stays bounded: at most
    one save is in flight, so a new save first waits for the previous one, and
    no host copy of the arrays stays cached on them. In a multi-process run
    every process creates the `Checkpointer` and makes the same calls.

    Use it as a context manager, or call `close()`, which waits for the save
    in flight.

    **Arguments:**

    - `directory`: where the steps live (`str` or `os.PathLike`); created if
      missing. On several hosts it must be on a filesystem they share.
    - `keep`: how many of the newest steps to keep (older ones are deleted
      once a newer one is complete); `None` keeps them all.

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
        self._in_flight: int | None = None  # the step being written, if any
        self._manager: Any = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep,
                enable_async_checkpointing=True,
                create=True,
                # Partial steps of writers that died are removed on opening.
                cleanup_tmp_directories=True,
            ),
        )

    def _open(self) -> Any:
        if self._manager is None:
            raise ValueError(f"this Checkpointer of {self.directory} is closed.")
        return self._manager

    def save(self, step: int, tree: Any, *, wait: bool = False) -> None:
        """Saves `tree` as step `step`.

        **Arguments:**

        - `step`: the step number, a non-negative `int` greater than every step
          saved so far in the directory.
        - `tree`: the pytree to save (anything
          [`save`][filterax.checkpoint.save] takes).
        - `wait`: `False` (the default) returns once the arrays have been
          copied off the devices, and writes in the background; `True`
          returns once the step is complete.

        **Returns:** `None`.

        **Raises:** `ValueError` when `step` is not after the latest step;
        what [`save`][filterax.checkpoint.save] raises for a leaf that cannot
        be saved (nothing is written then).

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
        manager = self._open()
        try:
            step = operator.index(step)
        except TypeError:
            raise TypeError(
                f"step must be an int, not {type(step).__name__}."
            ) from None
        if step < 0:
            raise ValueError(f"step must be non-negative, not {step}.")
        latest = manager.latest_step()
        if latest is not None and step <= latest:
            raise ValueError(
                f"cannot save step {step} in {self.directory}: step {latest} is "
                "already saved (or being saved) there, and steps must increase."
            )
        args = save_args(tree)  # every leaf checked before anything is written
        if not manager.save(step, args=args):
            raise ValueError(f"orbax declined to save step {step} in {self.directory}.")
        self._in_flight = step
        if wait:
            manager.wait_until_finished()

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
        self._open().wait_until_finished()

    def steps(self) -> list[int]:
        """The complete steps in the directory, oldest first.

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
        manager = self._open()
        # Orbax lists a step from the moment its save starts.
        if self._in_flight is not None and not manager.is_saving_in_progress():
            self._in_flight = None
        return sorted(step for step in manager.all_steps() if step != self._in_flight)

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
        onto `like`'s shardings, after checking that it matches `like`.

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
        manager = self._open()
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
        checkpoint = os.path.join(self.directory, str(step))
        return restore_tree(
            like, checkpoint, lambda args: manager.restore(step, args=args), where
        )

    def close(self) -> None:
        """Waits for the save in flight, then releases orbax's resources.
        Calling it again does nothing.

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
        if self._manager is not None:
            try:
                self._manager.wait_until_finished()
            finally:
                self._manager.close()
                self._manager = None

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
