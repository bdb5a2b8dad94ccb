"""Matching the key paths a filterax checkpoint stores with those of `like`:
the part of the file `like` is loaded from, or the error saying how they
differ."""

from __future__ import annotations

import re

from ._messages import SerialisationError, leaf_note
from ._registry import Leaf

__all__ = ["check_paths", "subtree_at"]


def check_paths(name: str, stored: list[str], wanted: list[Leaf]) -> None:
    """Raises the error saying how the file's key paths `stored` differ from
    those of `wanted` (nothing if they are equal)."""
    wanted_paths = [entry.path for entry in wanted]
    if stored == wanted_paths:
        return
    stored_set, wanted_set = set(stored), set(wanted_paths)
    missing = [entry for entry in wanted if entry.path not in stored_set]
    extra = [path for path in stored if path not in wanted_set]

    def listing(paths: list[str]) -> str:
        shown = ", ".join(paths[:5])
        return shown + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")

    problems = []
    first_at_fault = missing[0] if missing else None
    if missing:
        problems.append(
            "`like` has leaves the file has no entry for: "
            + listing([entry.path for entry in missing])
        )
    if extra:
        problems.append(
            f"the file has entries `like` has no leaf for: {listing(extra)}"
        )
    if not problems:
        index = next(i for i, (a, b) in enumerate(zip(stored, wanted_paths)) if a != b)
        first_at_fault = wanted[index]
        problems.append(
            f"the entries are in a different order (entry {index} is "
            f"{stored[index]}, `like` has {wanted_paths[index]} there)"
        )
    note = leaf_note(first_at_fault.key_path if first_at_fault else None, "missing")
    raise SerialisationError(
        f"{name} does not match the structure of `like`: {'; '.join(problems)}." + note
    )


def _is_under(path: str, prefix: str) -> bool:
    """Whether the key path `path` (a `keystr`) lies in the subtree at
    `prefix`."""
    return path.startswith(prefix) and path[len(prefix) : len(prefix) + 1] in (
        "",
        ".",
        "[",
    )


# One key of a `keystr`: `.name`, `[0]`, `['key']`, `["key"]`, `[<flat index 0>]`.
_ONE_KEY = re.compile(
    r"\.[A-Za-z_]\w*|\[(?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\]'\"]*)\]"
)


def subtree_at(stored: list[str], wanted: list[str]) -> tuple[int, str] | None:
    """Where the file holds `like` as one whole top-level part of what it
    saved (the model of a `(model, opt_state)` checkpoint, at `[0]`):
    `(index of its first entry, key of the part)`, when exactly one part
    fits. Deeper subtrees are not looked at: the optimiser state's moments
    mirror the model's paths too."""
    if not wanted or not wanted[0]:
        return None
    found = []
    for start, path in enumerate(stored[: len(stored) - len(wanted) + 1]):
        prefix = path[: len(path) - len(wanted[0])]
        if not path.endswith(wanted[0]) or not _ONE_KEY.fullmatch(prefix):
            continue
        block = range(start, start + len(wanted))
        if all(stored[i] == prefix + w for i, w in zip(block, wanted)) and [
            i for i, p in enumerate(stored) if _is_under(p, prefix)
        ] == list(block):
            found.append((start, prefix))
    return found[0] if len(found) == 1 else None
