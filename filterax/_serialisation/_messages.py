"""The error raised for unreadable or mismatching checkpoints, and the phrases
its messages are built from."""

from __future__ import annotations

from typing import Any

__all__ = [
    "SerialisationError",
    "leaf_note",
    "shape_str",
    "with_article",
]


class SerialisationError(ValueError, RuntimeError):
    """Raised when a file cannot be read as a checkpoint, or does not match the
    `like` pytree it is loaded into.

    The message names the file and, where there is one, the key path of the
    offending leaf. It is a `ValueError`, and also a `RuntimeError` (what
    Equinox raises for the same failures), so either `except` clause catches it.

    **Arguments:** the message, as for `ValueError`.

    **Returns:** an exception instance, to raise.

    ```python
    >>> import io
    >>> import filterax as fx
    >>> try:
    ...     fx.tree_deserialise_leaves(io.BytesIO(b"not a checkpoint"), [1.0])
    ... except fx.SerialisationError as error:
    ...     print(error)
    <BytesIO>: not a filterax checkpoint (starts with b'not a ch', expected b'\\x89FLTRAX\\n'), nor an Equinox one (NumPy records, starting with b'\\x93NUMPY'); was it written by `tree_serialise_leaves`?

    ```
    """


SerialisationError.__module__ = "filterax"


def shape_str(dtype: str, shape: tuple[int, ...]) -> str:
    return f"{dtype}[{','.join(map(str, shape))}]"


def with_article(phrase: str) -> str:
    # "a uint32 array" is said with a consonant sound, "an int32 array" not.
    vowel_sound = phrase[:1] in "aeiou" and not phrase.startswith(("uint", "uni"))
    return f"{'an' if vowel_sound else 'a'} {phrase}"


def leaf_note(key_path: tuple[Any, ...] | None, problem: str) -> str:
    """A closing sentence naming the leaf by its key objects as well, in the
    words Equinox uses, so that code matching Equinox's messages keeps working."""
    if key_path is None:
        return ""
    if problem == "missing":
        return f" Error at leaf with path {tuple(key_path)!r}."
    return f" Deserialised leaf at path {tuple(key_path)!r} does not match `like`."
