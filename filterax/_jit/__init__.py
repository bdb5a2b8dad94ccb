"""`filter_jit`: compiles a function, tracing its arrays and hashing everything else.

One wrapper, `JitWrapper` (`_api.py`), holds a `Policy` built once
(`_policy.py`: donation, except-first, shardings, and the order in which a
call's parts reach the inner `jax.jit`s). A call takes one of two routes; both
let `jax.jit`'s C++ fast path do the cache lookup.

- **Direct** (arguments without Modules whose leaves are all arrays or Refs):
  the arguments go to an inner `jax.jit` as they are.
- **Keyed** (arguments holding Modules, or non-array leaves): `describe(args,
  kwargs) -> (key, leaves)` (`_describe.py`, with the identity memo of
  Modules behind it) gives one hashable static key and the dynamic leaves,
  which an inner `jax.jit` receives.

The first call picks the route; a trace that finds its call needs another
route returns `REROUTE` before running the function, and the wrapper takes
that route from then on. `_compiled.py` holds the inner `jax.jit`s, shared by
every wrapper of one function, and what leaves the traces; `_layout.py` the
`in_shardings` and `out_shardings`, and outputs laid out like the arguments
they update on an `Auto` mesh; `_aot.py` `.lower(...).compile()`.

May import: `jax`, `_module` (`FunctionWrapper`), `_tree._split`, `_tree._structure`,
`_tree._filters`, `_caches`, `_compat`, `_errors`, `_transformed`, `_warnings`, and
`_mapping` (`filter_shard`, the prefix resolution of `_mapping/_axes.py` and
the sharding checks of `_mapping/_shard.py`, for the shardings).
"""

from ._api import JitWrapper, filter_jit

__all__ = ["JitWrapper", "filter_jit"]
