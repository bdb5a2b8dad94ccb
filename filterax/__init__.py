"""filterax: models as JAX pytrees, transformed with filtered transformations."""

from importlib.metadata import PackageNotFoundError, version as _version

# --- filters (_filters.py) ---
from ._filters import (
    combine as combine,
    filter as filter,
    is_array as is_array,
    is_array_like as is_array_like,
    is_inexact_array as is_inexact_array,
    is_inexact_array_like as is_inexact_array_like,
    is_key_array as is_key_array,
    partition as partition,
)

# --- non-differentiable marking (_nondiff.py) ---
from ._nondiff import (
    NonDifferentiable as NonDifferentiable,
    freeze as freeze,
    is_non_differentiable as is_non_differentiable,
    unfreeze as unfreeze,
)

# --- modules (_module.py, _partial.py) ---

# --- tree utilities (_tree.py, _pretty.py, _update.py) ---

# --- differentiation (_ad.py, _symbolic_zero.py, _custom.py, _checkpoint.py) ---

# --- compilation, batching, sharding (_jit.py, _vmap.py, _pmap.py, _shard.py, ...) ---

# --- serialisation (_serialisation.py) ---

try:
    __version__ = _version("filterax")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"
