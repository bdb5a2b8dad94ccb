"""filterax: models as JAX pytrees, transformed with filtered transformations."""

import typing as _typing
from importlib.metadata import (
    PackageNotFoundError as _PackageNotFoundError,
    version as _version,
)

from ._missing import missing_name_error as _missing_name_error

# --- filters (_tree/_filters.py) ---
from ._tree._filters import (
    combine as combine,
    filter as filter,
    is_array as is_array,
    is_array_like as is_array_like,
    is_inexact_array as is_inexact_array,
    is_inexact_array_like as is_inexact_array_like,
    is_key_array as is_key_array,
    is_ref as is_ref,
    partition as partition,
)

# --- warnings (_warnings.py) ---
from ._warnings import ClassVarFieldWarning as ClassVarFieldWarning
from ._warnings import FilteraxDeprecationWarning as FilteraxDeprecationWarning
from ._warnings import FilteraxWarning as FilteraxWarning
from ._warnings import NoDifferentiableLeafWarning as NoDifferentiableLeafWarning

# --- annotations (_typing.py) ---
from ._typing import PyTree as PyTree

# --- modules (_module/) ---
from ._module import (
    AbstractClassVar as AbstractClassVar,
    AbstractVar as AbstractVar,
    BoundMethod as BoundMethod,
    Module as Module,
    Partial as Partial,
    StaticArrayWarning as StaticArrayWarning,
    StrictConfig as StrictConfig,
    field as field,
    module_update_wrapper as module_update_wrapper,
    static_field as static_field,
)

# --- tree utilities (_tree/_utilities.py, _pretty.py, _update.py) ---
from ._pretty import tree_pformat as tree_pformat, tree_pprint as tree_pprint
from ._tree._structure import (
    TreeDifference as TreeDifference,
    tree_check as tree_check,
    tree_diff as tree_diff,
    tree_flatten_one_level as tree_flatten_one_level,
)
from ._tree._utilities import tree_at as tree_at, tree_equal as tree_equal
from ._update import apply_updates as apply_updates

# --- differentiation (_ad/) ---
from ._ad import (
    NonDifferentiable as NonDifferentiable,
    SymbolicZero as SymbolicZero,
    filter_checkpoint as filter_checkpoint,
    filter_custom_jvp as filter_custom_jvp,
    filter_custom_vjp as filter_custom_vjp,
    filter_grad as filter_grad,
    filter_hessian as filter_hessian,
    filter_jacfwd as filter_jacfwd,
    filter_jacrev as filter_jacrev,
    filter_jvp as filter_jvp,
    filter_value_and_grad as filter_value_and_grad,
    filter_vjp as filter_vjp,
    freeze as freeze,
    is_non_differentiable as is_non_differentiable,
    trainable as trainable,
    unfreeze as unfreeze,
    zero_cotangent as zero_cotangent,
)

# --- compilation, batching, sharding (_jit/, _mapping/, _sharding/, _eval_shape.py, ...) ---
from ._caches import clear_caches as clear_caches
from ._callback import filter_pure_callback as filter_pure_callback
from ._closure_convert import filter_closure_convert as filter_closure_convert
from ._eval_shape import filter_eval_shape as filter_eval_shape
from ._jit import filter_jit as filter_jit
from ._make_jaxpr import filter_make_jaxpr as filter_make_jaxpr
from ._mapping import (
    filter_pmap as filter_pmap,
    filter_shard as filter_shard,
    filter_shard_map as filter_shard_map,
    filter_vmap as filter_vmap,
    if_array as if_array,
)
from ._sharding import (
    logical_axes as logical_axes,
    sharded_init as sharded_init,
    sharding_of as sharding_of,
)

# --- control flow (_control/) ---
from ._control import (
    filter_cond as filter_cond,
    filter_fori_loop as filter_fori_loop,
    filter_scan as filter_scan,
    filter_switch as filter_switch,
    filter_while_loop as filter_while_loop,
)

# --- mixed precision (_precision/) ---
from ._precision import (
    DynamicLossScale as DynamicLossScale,
    NoOpLossScale as NoOpLossScale,
    Precision as Precision,
    StaticLossScale as StaticLossScale,
    all_finite as all_finite,
    cast as cast,
    mixed_precision as mixed_precision,
    select_tree as select_tree,
)

# --- runtime errors (_errors/) ---
from ._errors import (
    EquinoxRuntimeError as EquinoxRuntimeError,
    EquinoxTracetimeError as EquinoxTracetimeError,
    FilteraxRuntimeError as FilteraxRuntimeError,
    FilteraxTracetimeError as FilteraxTracetimeError,
    branched_error_if as branched_error_if,
    error_if as error_if,
)

# --- enumerations (_enumeration.py) ---
from ._enumeration import (
    Enumeration as Enumeration,
    EnumerationItem as EnumerationItem,
)

# --- randomness (_rng/) ---
from ._rng import RngStream as RngStream

# --- serialisation (_serialisation/) ---
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


def __getattr__(name: str) -> _typing.NoReturn:
    # Only called for names not found: Equinox's get an explanation.
    _missing_name_error("filterax", name)


# --- public subpackages: built on the names above, so imported last ---
from . import debug as debug, nn as nn  # noqa: E402
from .nn._inference import tree_inference as tree_inference  # noqa: E402
