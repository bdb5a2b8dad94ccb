"""`filter_jit`: compiles a function, tracing its arrays and hashing everything else.

A call takes one of two routes; both let `jax.jit`'s C++ fast path do the cache
lookup, and neither builds closures per call.

- **Direct** (`_direct.py`; arguments without Modules whose leaves are all
  arrays or Refs): the arguments go to an inner `jax.jit` as they are, and
  whether they really are all arrays is checked once per compilation, while
  tracing.
- **Keyed** (`_keyed.py`; arguments holding Modules, or non-array leaves): the
  arguments are described as tokens (Modules of frozen structure found by
  identity through `_memo.py` instead of flattened again), and an inner
  `jax.jit` receives one hashable static key plus the dynamic leaves as a list.

The first call picks the route; a function that turns out to need the keyed
route uses it from then on. `_compiled.py` holds the inner `jax.jit`s, shared
by every wrapper of one function; `_outputs.py` what leaves the trace (arrays,
and everything else in the treedef, input Refs mapped back); `_donate.py`
buffer donation; `_aot.py` `.lower(...).compile()`; `_layout.py` the
`in_shardings` and `out_shardings` (applied inside the trace; wrappers given
them are a subclass, so other calls pay nothing), and, for calls without them
whose arrays lie on an `Auto` mesh, outputs laid out like the arguments they
update (decided once per trace); `_groups.py` the order in
which a call's parts reach the inner `jax.jit`s; `_api.py` the public function
and its wrappers (`FunctionWrapper`s, like every filtered transform's).

May import: `jax`, `_module` (`FunctionWrapper`), `_split`, `_structure`,
`_filters`, `_caches`, `_compat`, `_errors`, `_transformed`, `_warnings`, and
`_mapping` (`filter_shard`, the prefix resolution of `_mapping/_axes.py` and
the sharding checks of `_mapping/_shard.py`, for the shardings).
"""

from ._api import JitWrapper, filter_jit

__all__ = ["JitWrapper", "filter_jit"]
