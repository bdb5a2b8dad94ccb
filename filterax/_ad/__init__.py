"""Differentiation: non-differentiable marking, `SymbolicZero`, gradients,
forward mode, VJPs, Jacobians, custom rules and checkpointing.

- `_nondiff.py`: `NonDifferentiable`, `freeze`, `unfreeze`, `trainable`, and
  `partition_differentiable`, the one definition of "differentiable leaf".
- `_symbolic_zero.py`: `SymbolicZero`, `zero_cotangent`.
- `_perturbation.py`: splitting into what JAX differentiates and what it
  carries, and matching user-given tangents/cotangents (errors name key paths).
- `_refs.py`: the views of `jax.Ref`s handed to differentiated functions.
- `_wrapper.py`: unpacking `has_aux` outputs; the callable pytrees the
  transforms return are `_module`'s `FunctionWrapper`s.
- `_grad.py`, `_jvp.py`, `_vjp.py`, `_jacobian.py`, `_custom.py`,
  `_checkpoint.py`: one transform (family) each.

May import: `jax`, `_tree._filters`, `_tree._split`, `_tree._structure`, `_pretty`, `_tree`,
`_compat`, `_warnings`, `_module` and `_treescope` (the display hooks).
Nothing below this folder imports it.
"""

from ._checkpoint import filter_checkpoint
from ._custom import filter_custom_jvp, filter_custom_vjp
from ._grad import filter_grad, filter_value_and_grad
from ._jacobian import filter_hessian, filter_jacfwd, filter_jacrev
from ._jvp import filter_jvp
from ._nondiff import (
    NonDifferentiable,
    freeze,
    is_non_differentiable,
    trainable,
    unfreeze,
    unfrozen,
)
from ._symbolic_zero import SymbolicZero, zero_cotangent
from ._vjp import filter_vjp

__all__ = [
    "NonDifferentiable",
    "SymbolicZero",
    "filter_checkpoint",
    "filter_custom_jvp",
    "filter_custom_vjp",
    "filter_grad",
    "filter_hessian",
    "filter_jacfwd",
    "filter_jacrev",
    "filter_jvp",
    "filter_value_and_grad",
    "filter_vjp",
    "freeze",
    "is_non_differentiable",
    "trainable",
    "unfreeze",
    "unfrozen",
    "zero_cotangent",
]
