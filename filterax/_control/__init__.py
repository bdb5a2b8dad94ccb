"""Control flow over any pytree: `filter_scan`, `filter_cond`, `filter_switch`,
`filter_fori_loop`, `filter_while_loop`.

- `_parts.py`: a tree as arrays (traced), Refs (shared) and static leaves; the
  carry rule and the key-path errors of every loop and branch.
- `_jaxpr.py`: a body traced once, with its closed-over values made explicit
  (for the custom derivative rules); whether a body writes a Ref.
- `_guard.py`: forward mode allowed, reverse mode refused with our message.
- `_scan.py`: `filter_scan`, and its segmented, `jax.checkpoint`ed variant.
- `_cond.py`: `filter_cond`, `filter_switch`.
- `_loops.py`: `filter_fori_loop`, `filter_while_loop` (`kind="lax"`,
  `"bounded"`).
- `_checkpointed.py`: `filter_while_loop(kind="checkpointed")`: online
  checkpointing with a fixed buffer, as a `jax.custom_vjp`.
- `_schedule.py`: which steps that buffer keeps, and where the backward pass
  places new checkpoints.

May import: `jax`, and from filterax only `_tree._split`, `_tree._structure`, `_tree._filters`
and `_compat`.
"""

from ._cond import filter_cond, filter_switch
from ._loops import filter_fori_loop, filter_while_loop
from ._scan import filter_scan

__all__ = [
    "filter_cond",
    "filter_fori_loop",
    "filter_scan",
    "filter_switch",
    "filter_while_loop",
]
