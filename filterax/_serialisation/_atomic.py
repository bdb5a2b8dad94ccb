"""Atomic writes to a path: a temporary file, renamed over the path once
complete and on disk; and the removal of temporary files that killed writers
left behind.

Rule for stale temporary files. A writer of `dir/name` writes to
`dir/.name.<12 hex digits>.tmp` and holds an exclusive `flock` on it from just
after creating it until it has been renamed over `dir/name`. The operating
system drops the lock when its process dies, however it dies (`SIGKILL`
included). When a write is complete (just before its rename, so that a writer
killed right after the rename leaves no stale file behind), every other file in
`dir` named `.name.<12 hex digits>.tmp` (that exact pattern, for that exact
`name`) whose lock can be taken at once belongs to no live writer, and is
removed. A file whose lock is held is being written right now, and is left
alone.

A writer that created its file but has not yet locked it could be mistaken for
a dead one; so after taking its lock, a writer checks that its name still
refers to its file, and starts over with a new name if a cleaner removed it.

Where `fcntl` does not exist (Windows), a file open in a live writer cannot be
removed, so the cleaner simply tries, and a refusal means the file is in use.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
from collections.abc import Iterator
from typing import IO

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

__all__ = ["atomic_output"]

_OPEN_NEW = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
_OPEN_EXISTING = os.O_RDWR | getattr(os, "O_BINARY", 0) | getattr(os, "O_NOFOLLOW", 0)


def temporary_pattern(base: str) -> re.Pattern[str]:
    """The names of temporary files of writers to a file called `base`."""
    return re.compile(rf"\.{re.escape(base)}\.[0-9a-f]{{12}}\.tmp")


def _try_lock(descriptor: int, *, wait: bool) -> bool:
    assert fcntl is not None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except OSError:
        return False
    return True


def _names(descriptor: int, path: str) -> bool:
    """Whether `path` is (still) the name of the file open as `descriptor`."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    opened = os.fstat(descriptor)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _create_temporary(directory: str, base: str, target: str) -> tuple[int, str]:
    """Creates, and locks, a new temporary file beside `target`."""
    while True:
        temporary = os.path.join(directory, f".{base}.{secrets.token_hex(6)}.tmp")
        try:
            # 0o666 less the umask, like `open`; O_EXCL as the name must be new.
            descriptor = os.open(temporary, _OPEN_NEW, 0o666)
        except OSError as error:
            raise type(error)(
                error.errno,
                f"{error.strerror}: cannot write the checkpoint {target!r} "
                f"(it is written through a temporary file in {directory!r})",
                target,
            ) from None
        if fcntl is None:
            return descriptor, temporary
        if _try_lock(descriptor, wait=True) and _names(descriptor, temporary):
            return descriptor, temporary
        os.close(descriptor)  # removed by a cleaner before we locked it: retry


def remove_stale_temporaries(target: str) -> list[str]:
    """Removes the temporary files of writers to `target` that are not being
    written (see the module docstring); returns their paths."""
    directory, base = os.path.split(target)
    pattern = temporary_pattern(base)
    removed = []
    try:
        candidates = [
            entry.path
            for entry in os.scandir(directory or ".")
            if pattern.fullmatch(entry.name)
        ]
    except OSError:
        return removed
    for path in candidates:
        if fcntl is None:
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed.append(path)
            continue
        try:
            descriptor = os.open(path, _OPEN_EXISTING)
        except OSError:
            continue  # gone already, a symlink, or not ours to open
        try:
            if _try_lock(descriptor, wait=False) and _names(descriptor, path):
                os.unlink(path)
                removed.append(path)
        except OSError:
            pass
        finally:
            os.close(descriptor)
    return removed


def _replace(temporary: str, target: str) -> None:
    try:
        os.replace(temporary, target)
    except OSError as error:
        raise type(error)(
            error.errno,
            f"{error.strerror}: cannot write the checkpoint {target!r}",
            target,
        ) from None


@contextlib.contextmanager
def atomic_output(target: str) -> Iterator[IO[bytes]]:
    """Yields a stream to write to: a temporary file in the same directory as
    `target` (already resolved through symlinks) that replaces it only once
    it is complete and on disk, and is deleted if writing fails. Just before
    the rename, stale temporary files of `target` are removed."""
    directory, base = os.path.split(target)
    descriptor, temporary = _create_temporary(directory, base, target)
    stream = os.fdopen(descriptor, "wb")
    try:
        with stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
            with contextlib.suppress(FileNotFoundError):
                os.chmod(temporary, stat.S_IMODE(os.stat(target).st_mode))
            # Before the rename, while this writer's own file is still open and
            # locked (so it is not taken for a stale one): a writer killed
            # after its rename then never leaves older temporaries behind.
            remove_stale_temporaries(target)
            if fcntl is not None:
                # Renamed while still locked: a cleaner must not take it for
                # a dead writer's file between the close and the rename.
                _replace(temporary, target)
        if fcntl is None:  # Windows renames only closed files
            _replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    # Make the rename itself durable; not possible on every platform.
    with contextlib.suppress(OSError):
        directory_descriptor = os.open(directory or ".", os.O_RDONLY)
        try:
            os.fsync(directory_descriptor)
        finally:
            os.close(directory_descriptor)
