"""`filterax.debug`: tools for finding out what a transformed program does.

- `_max_traces.py`: `assert_max_traces`, `get_num_traces`.
- `_breakpoint.py`: `breakpoint_if`.
- `_backward_nan.py`: `backward_nan`.
- `_dce.py`: `store_dce`, `inspect_dce`.
- `_announce.py`: `announce_transform`.

Written with the core's public names, imported from the packages that define
them, not from the root package, which imports this one (so the import graph
has no circle). Nothing outside `filterax/__init__.py` imports this package.

May import: the core's public names from `_ad`, `_tree._filters`, `_module`,
`_pretty`, `_missing`, `_compat` (the primitive of `announce_transform`); from `_errors` also the helpers that runtime checks share
(`any_over_batch`, `own_frames_on_top`); `jax`, NumPy.
"""

from typing import NoReturn as _NoReturn

from .._missing import missing_name_error as _missing_name_error
from ._announce import announce_transform as announce_transform
from ._backward_nan import backward_nan as backward_nan
from ._breakpoint import breakpoint_if as breakpoint_if
from ._dce import inspect_dce as inspect_dce, store_dce as store_dce
from ._max_traces import (
    assert_max_traces as assert_max_traces,
    get_num_traces as get_num_traces,
)

__all__ = [
    "announce_transform",
    "assert_max_traces",
    "backward_nan",
    "breakpoint_if",
    "get_num_traces",
    "inspect_dce",
    "store_dce",
]


def __getattr__(name: str) -> _NoReturn:
    # Only called for names not found: Equinox's get an explanation.
    _missing_name_error("filterax.debug", name)
