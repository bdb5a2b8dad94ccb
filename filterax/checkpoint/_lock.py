"""The writer's claim on a `Checkpointer` directory: one writer at a time.

The claim is the file `filterax.writer` in the directory, created atomically,
naming the host, the process id, the process's start time and a random token.
A second writer is refused while the claim's holder lives. A holder known to
be gone (on this host, its process id no longer runs, or runs a process
started at another time) loses its claim to the next writer, which then
removes the partial steps it left (their names carry `.filterax-tmp-`).
Readers never claim, and never remove anything.

Imports the standard library only.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import uuid
from typing import Any

__all__ = ["LOCK", "TEMPORARY", "Claim", "claim", "remove_partial"]

LOCK = "filterax.writer"
# In the names of partial steps and of steps being deleted.
TEMPORARY = ".filterax-tmp-"
DELETING = ".filterax-deleting-"


def _start_time(pid: int) -> str | None:
    """When process `pid` started (in clock ticks since boot), where the
    system says (Linux's /proc); `None` elsewhere or if it does not run."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except OSError:
        return None
    # The command name, in parentheses, may hold spaces: count after it.
    fields = text[text.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def _runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _me() -> dict[str, Any]:
    pid = os.getpid()
    return {
        "host": socket.gethostname(),
        "pid": pid,
        "started": _start_time(pid),
        "token": uuid.uuid4().hex[:16],
    }


def _describe(holder: dict[str, Any]) -> str:
    return f"process {holder.get('pid')} on host {holder.get('host')!r}"


def _gone(holder: dict[str, Any]) -> bool:
    """Whether the holder of a claim is known to have ended."""
    if holder.get("host") != socket.gethostname():
        return False  # another host: nothing to tell from here
    pid = holder.get("pid")
    if not isinstance(pid, int) or not _runs(pid):
        return True
    started = holder.get("started")
    return started is not None and _start_time(pid) not in (None, started)


def remove_partial(directory: str) -> None:
    """Removes the partial steps and half-deleted steps under `directory`."""
    for name in os.listdir(directory):
        if TEMPORARY in name or DELETING in name:
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


class Claim:
    """A held claim: `token` names this writer's partial steps."""

    def __init__(self, path: str, holder: dict[str, Any]):
        self.path = path
        self.holder = holder
        self.token: str = holder["token"]

    def release(self) -> None:
        """Gives the claim up, if it is still this writer's."""
        try:
            with open(self.path) as file:
                current = json.load(file)
        except (OSError, ValueError):
            return
        if current.get("token") == self.token:
            os.remove(self.path)


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as file:
            holder = json.load(file)
        return holder if isinstance(holder, dict) else {}
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # damaged, or being written: held by someone unknown


def claim(directory: str) -> Claim:
    """Claims `directory` for this process's writer, taking over the claim of
    a writer known to be gone (and removing its partial steps).

    Raises `RuntimeError` naming the directory and the live writer that holds
    it."""
    path = os.path.join(directory, LOCK)
    me = _me()
    draft = f"{path}.{me['token']}"
    with open(draft, "w") as file:
        json.dump(me, file)
    try:
        for _ in range(3):
            try:
                os.link(draft, path)  # atomic: fails if a claim exists
            except FileExistsError:
                holder = _read(path)
                if holder is None:
                    continue  # released meanwhile
                if not holder or not _gone(holder):
                    who = _describe(holder) if holder else "an unknown writer"
                    raise RuntimeError(
                        f"{directory} is being written by another Checkpointer: "
                        f"{who} holds it ({path}). Only one writer may save "
                        "steps in a directory at a time; readers may open it. "
                        "If that writer has ended (on another host, say), "
                        f"remove {path}."
                    ) from None
                # Its holder has ended: set the stale claim aside, and make
                # sure it was that one (not a claim made meanwhile).
                stale = f"{path}.stale-{me['token']}"
                try:
                    os.rename(path, stale)
                except FileNotFoundError:
                    continue
                if _read(stale) != holder:
                    os.rename(stale, path)
                    continue
                os.remove(stale)
                continue
            remove_partial(directory)
            return Claim(path, me)
        raise RuntimeError(f"could not claim {directory} for writing ({path}).")
    finally:
        os.remove(draft)
