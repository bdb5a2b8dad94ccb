"""filterax: models as JAX pytrees, transformed with filtered transformations."""

from importlib.metadata import (
    PackageNotFoundError as _PackageNotFoundError,
    version as _version,
)

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
    trainable as trainable,
    unfreeze as unfreeze,
)

# --- modules (_module.py, _partial.py) ---
from ._module import (
    AbstractClassVar as AbstractClassVar,
    AbstractVar as AbstractVar,
    BoundMethod as BoundMethod,
    Module as Module,
    StaticArrayWarning as StaticArrayWarning,
    field as field,
)
from ._partial import Partial as Partial

# --- tree utilities (_tree.py, _pretty.py, _update.py) ---
from ._pretty import tree_pformat as tree_pformat, tree_pprint as tree_pprint
from ._tree import tree_at as tree_at, tree_equal as tree_equal
from ._update import apply_updates as apply_updates

# --- differentiation (_ad.py, _symbolic_zero.py, _custom.py, _checkpoint.py) ---
from ._ad import (
    filter_grad as filter_grad,
    filter_hessian as filter_hessian,
    filter_jacfwd as filter_jacfwd,
    filter_jacrev as filter_jacrev,
    filter_jvp as filter_jvp,
    filter_value_and_grad as filter_value_and_grad,
)
from ._checkpoint import filter_checkpoint as filter_checkpoint
from ._custom import (
    filter_custom_jvp as filter_custom_jvp,
    filter_custom_vjp as filter_custom_vjp,
)
from ._symbolic_zero import (
    SymbolicZero as SymbolicZero,
    zero_cotangent as zero_cotangent,
)
from ._vjp import filter_vjp as filter_vjp

# --- compilation, batching, sharding (_jit.py, _vmap.py, _pmap.py, _shard.py, ...) ---
from ._caches import clear_caches as clear_caches
from ._callback import filter_pure_callback as filter_pure_callback
from ._closure_convert import filter_closure_convert as filter_closure_convert
from ._eval_shape import filter_eval_shape as filter_eval_shape
from ._jit import filter_jit as filter_jit
from ._make_jaxpr import filter_make_jaxpr as filter_make_jaxpr
from ._pmap import filter_pmap as filter_pmap
from ._shard import filter_shard as filter_shard
from ._vmap import filter_vmap as filter_vmap, if_array as if_array

# --- serialisation (_serialisation.py) ---
from ._serialisation import (
    SerialisationError as SerialisationError,
    default_deserialise_filter_spec as default_deserialise_filter_spec,
    default_serialise_filter_spec as default_serialise_filter_spec,
    tree_deserialise_leaves as tree_deserialise_leaves,
    tree_serialise_leaves as tree_serialise_leaves,
)

try:
    __version__ = _version("filterax")
except _PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"
