"""Where `filter_while_loop(kind="checkpointed")` keeps its checkpoints.

A fixed buffer of `k` slots holds carries. `Checkpoints` says which step each
occupied slot holds: entries `[0, used)` of `steps` and `slots`, sorted by
step; `slots[used:]` are the free slots (so `slots` is always a permutation of
`range(k)`, and a carry never moves once written).

Forward pass, steps unknown (`store`): every step's carry is offered, and
the buffer keeps a spread that thins out towards the past, the dynamic
allocation of Wang, Moin and Iaccarino (SIAM J. Sci. Comput., 2009): each
checkpoint has a level; while slots are free a carry is kept at level 0; once
they are full, a *dispensable* checkpoint (one with a later checkpoint of a
higher level) gives its slot to the new carry at level 0, or, if there is none,
the newest checkpoint is replaced by the new carry one level up. Step 0 is
never dropped.

Backward pass (`advance_for`): the checkpoints form a stack. To reach step
`t` from the newest checkpoint at step `s` with `f` free slots, advance by the
amount that binomial checkpointing (Griewank's "revolve") finds optimal, push
the carry reached, and repeat; with no free slot, advance straight to `t`.
With `f` free slots, `L = t - s + 1` steps are reversed in `r` sweeps, where
`r` is the least integer with `C(f + 1 + r, r) >= L`: O(L log L) recomputation
when `f >= log2(L)`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["Checkpoints", "advance_for", "empty_checkpoints", "store"]

# The level of step 0: never dispensable, never replaced.
_TOP_LEVEL = 2**30


class Checkpoints(NamedTuple):
    steps: jax.Array  # int32[k]: the step of each entry, sorted in [0, used)
    levels: jax.Array  # int32[k]
    slots: jax.Array  # int32[k]: the buffer slot of each entry, free ones after
    used: jax.Array  # int32[]


def empty_checkpoints(k: int) -> Checkpoints:
    zeros = jnp.zeros(k, jnp.int32)
    return Checkpoints(zeros, zeros, jnp.arange(k, dtype=jnp.int32), jnp.int32(0))


def store(
    book: Checkpoints, step: jax.Array
) -> tuple[Checkpoints, jax.Array, jax.Array]:
    """Offers the carry of `step` to the buffer; returns the new bookkeeping,
    the buffer slot to write the carry to, and whether to write it (always,
    except with a single slot, which keeps step 0)."""
    k = book.steps.shape[0]
    index = jnp.arange(k, dtype=jnp.int32)
    full = book.used == k
    # A checkpoint is dispensable when a later one has a higher level.
    later_max = jnp.concatenate(
        [jax.lax.cummax(book.levels, reverse=True)[1:], jnp.full(1, -1, jnp.int32)]
    )
    dispensable = full & (book.levels < later_max)
    any_dispensable = dispensable.any()
    newest_dispensable = k - 1 - jnp.argmax(dispensable[::-1]).astype(jnp.int32)
    # Without a dispensable checkpoint the newest one is replaced, one level up;
    # with k = 1 that would be step 0, which is kept instead.
    replace_newest = full & ~any_dispensable
    keep = ~(replace_newest & (k == 1))
    removed = jnp.where(full & any_dispensable, newest_dispensable, k)
    write = jnp.where(full, k - 1, book.used)
    level = jnp.where(
        replace_newest,
        book.levels[k - 1] + 1,
        jnp.where(step == 0, _TOP_LEVEL, 0),
    )
    slot = jnp.where(
        full & any_dispensable, book.slots[newest_dispensable], book.slots[write]
    )

    def place(values: jax.Array, new: jax.Array) -> jax.Array:
        shifted = jnp.where(index >= removed, jnp.roll(values, -1), values)
        return jnp.where(keep, shifted.at[write].set(new), values)

    new_book = Checkpoints(
        place(book.steps, step),
        place(book.levels, level),
        place(book.slots, slot),
        jnp.where(keep, jnp.minimum(book.used + 1, k), book.used),
    )
    return new_book, slot, keep


def advance_for(length: jax.Array, free: jax.Array) -> jax.Array:
    """How far to advance from a checkpoint to reverse `length` steps with
    `free` free slots: the first checkpoint revolve would place, in
    `[1, length - 1]` (for `length >= 2`, `free >= 1`)."""
    s = (free + 1).astype(jnp.float32)
    target = length.astype(jnp.float32)

    # b(r) = C(s + r, r); find the least r with b(r) >= length, keeping b(r - 2).
    def more(state: tuple) -> jax.Array:
        _, b, _, _ = state
        return b < target

    def next_r(state: tuple) -> tuple:
        r, b, b1, _ = state
        r = r + 1
        return r, jnp.round(b * (s + r) / r), b, b1

    zero = jnp.float32(0)
    r, b, _, b2 = jax.lax.while_loop(more, next_r, (zero, jnp.float32(1), zero, zero))
    # C(s - 1 + r, r) = C(s + r, r) * s / (s + r)
    b_fewer = jnp.round(b * s / (s + r))
    advance = jnp.maximum(b2, target - b_fewer)
    return jnp.clip(advance, 1, jnp.maximum(target - 1, 1)).astype(jnp.int32)
