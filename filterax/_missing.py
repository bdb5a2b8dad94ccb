"""Names that Equinox has and filterax does not: asking for one raises an
`AttributeError` that says so and where to read about it, rather than a bare
"no attribute"."""

from __future__ import annotations

from typing import NoReturn

__all__ = ["missing_name_error"]

MIGRATION_GUIDE = "docs/migration.md (section 'Equinox names filterax does not have')"

# Name -> why it is absent, or what to use instead.
EQUINOX_NAMES: dict[str, dict[str, str]] = {
    "filterax": {
        "internal": "Equinox's private namespace has no public counterpart; its "
        "loops are filterax's public `filter_scan`, `filter_while_loop`...",
    },
    "filterax.nn": {},
    "filterax.debug": {},
}


def missing_name_error(namespace: str, name: str) -> NoReturn:
    """Raises the `AttributeError` for `namespace.name` (a module's
    `__getattr__` calls this for every name it does not have)."""
    reason = EQUINOX_NAMES.get(namespace, {}).get(name)
    if reason is not None:
        equinox = "equinox" + namespace.removeprefix("filterax")
        raise AttributeError(
            f"{namespace} has no `{name}`, which {equinox} has: {reason}. See the "
            f"migration guide, {MIGRATION_GUIDE}."
        )
    raise AttributeError(f"module {namespace!r} has no attribute {name!r}")
