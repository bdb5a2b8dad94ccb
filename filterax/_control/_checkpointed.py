"""`filter_while_loop(kind="checkpointed")`: a while loop whose reverse mode
stores at most `k` carries, whether or not the number of steps is known.

A `jax.custom_vjp` on flat arrays:

- primal: `lax.while_loop`, nothing stored;
- forward pass of reverse mode: the same loop, offering each step's carry to
  a buffer of `k` slots (`_schedule.store`);
- backward pass: a `lax.while_loop` that either pulls the cotangent back
  through the step whose carry is the newest checkpoint (then drops it), or
  recomputes forward from that checkpoint and pushes the carry reached
  (`_schedule.advance_for`). One step's VJP is taken at a time, so the
  backward pass stores one step's residuals besides the buffer.

The body and the condition are traced once (`_jaxpr.trace_body`): the values
they close over become inputs of the custom VJP, so gradients reach them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import compress
from operator import not_
from typing import Any

import jax
import jax.numpy as jnp

from .._tree._filters import is_inexact_array
from .._tree._split import interleave
from ._jaxpr import TracedBody
from ._schedule import Checkpoints, advance_for, empty_checkpoints, store

__all__ = ["checkpointed_while"]

_REF_WRITES_MESSAGE = (
    'filter_while_loop(kind="checkpointed"): the body writes a Ref, and the '
    "backward pass recomputes steps from checkpoints, which would repeat those "
    'writes. Use kind="bounded" with `max_steps` (every step stored, nothing '
    "recomputed), or move the state out of the Ref into the carry."
)


def checkpointed_while(
    cond: TracedBody,
    body: TracedBody,
    carry: Sequence[Any],
    max_steps: int | None,
    checkpoints: int,
) -> list[Any]:
    """The final carry of `while cond(c): c = body(c)` from `carry` (flat
    arrays), reverse-mode differentiable with `checkpoints` stored carries."""
    carry = list(carry)
    diff_carry = bytes(map(is_inexact_array, carry))
    diff_hoisted = bytes(map(is_inexact_array, body.hoisted))

    def keep_going(cond_h: list, cond_r: list, c: list, i: jax.Array) -> Any:
        (go,) = cond.call(cond_h, cond_r, *c)
        return go if max_steps is None else go & (i < max_steps)

    def run(step: Step, cond_h: list, cond_r: list, c: list) -> list:
        final, _ = jax.lax.while_loop(
            lambda state: keep_going(cond_h, cond_r, *state),
            lambda state: (step(state[0]), state[1] + 1),
            (c, jnp.int32(0)),
        )
        return final

    def run_storing(step: Step, cond_h: list, cond_r: list, c: list) -> tuple:
        buffer = [jnp.zeros((checkpoints, *x.shape), x.dtype) for x in c]

        def loop_body(state: tuple) -> tuple:
            c, i, book, buffer = state
            book, slot, write = store(book, i)
            if checkpoints == 1:  # only step 0 is kept
                c_kept = [jnp.where(write, x, b[slot]) for x, b in zip(c, buffer)]
            else:
                c_kept = c
            buffer = [
                jax.lax.dynamic_update_index_in_dim(b, x, slot, 0)
                for b, x in zip(buffer, c_kept)
            ]
            return step(c), i + 1, book, buffer

        return jax.lax.while_loop(
            lambda state: keep_going(cond_h, cond_r, state[0], state[1]),
            loop_body,
            (c, jnp.int32(0), empty_checkpoints(checkpoints), buffer),
        )

    def body_step(hoisted: Sequence[Any], refs: Sequence[Any]) -> Step:
        return lambda c: body.call(hoisted, refs, *c)

    @jax.custom_vjp
    def loop(
        hoisted_d: list,
        carry_d: list,
        hoisted_n: list,
        carry_n: list,
        cond_h: list,
        refs: list,
        cond_r: list,
    ) -> list:
        step = body_step(interleave(diff_hoisted, hoisted_d, hoisted_n), refs)
        return run(step, cond_h, cond_r, interleave(diff_carry, carry_d, carry_n))

    def loop_fwd(
        hoisted_d: list,
        carry_d: list,
        hoisted_n: list,
        carry_n: list,
        cond_h: list,
        refs: list,
        cond_r: list,
    ) -> tuple:
        if body.writes_refs:
            raise TypeError(_REF_WRITES_MESSAGE)
        hoisted = interleave(diff_hoisted, hoisted_d, hoisted_n)
        final, steps, book, buffer = run_storing(
            body_step(hoisted, refs),
            cond_h,
            cond_r,
            interleave(diff_carry, carry_d, carry_n),
        )
        return final, (hoisted, refs, steps, book, buffer)

    def loop_bwd(residuals: tuple, final_ct: list) -> tuple:
        hoisted, refs, steps, book, buffer = residuals
        pullback = _StepPullback(body, hoisted, refs, diff_hoisted, diff_carry)
        ct_hoisted, ct_carry = _backward(
            pullback, steps, book, buffer, _pick(diff_carry, final_ct), checkpoints
        )
        return (
            ct_hoisted,
            ct_carry,
            [None] * (len(body.hoisted) - len(ct_hoisted)),
            [None] * (len(carry) - len(ct_carry)),
            [None] * len(cond.hoisted),
            [None] * len(body.refs),
            [None] * len(cond.refs),
        )

    loop.defvjp(loop_fwd, loop_bwd)
    return loop(
        _pick(diff_hoisted, body.hoisted),
        _pick(diff_carry, carry),
        _pick(diff_hoisted, body.hoisted, False),
        _pick(diff_carry, carry, False),
        list(cond.hoisted),
        list(body.refs),
        list(cond.refs),
    )


Step = Callable[[list], list]


def _pick(mask: bytes, values: Iterable[Any], want: bool = True) -> list:
    """The `values` where `mask` is non-zero (zero, with `want=False`)."""
    return list(compress(values, mask if want else map(not_, mask)))


class _StepPullback:
    """One step of the body, and its VJP with respect to the differentiable
    (inexact) carry leaves and closed-over values."""

    def __init__(
        self,
        body: TracedBody,
        hoisted: list,
        refs: list,
        diff_hoisted: bytes,
        diff_carry: bytes,
    ):
        self.body, self.hoisted, self.refs = body, hoisted, refs
        self.diff_hoisted, self.diff_carry = diff_hoisted, diff_carry
        self.hoisted_d = _pick(diff_hoisted, hoisted)
        self.hoisted_n = _pick(diff_hoisted, hoisted, False)

    def step(self, c: list) -> list:
        return self.body.call(self.hoisted, self.refs, *c)

    def pull_back(self, c: list, ct: list) -> tuple[list, list]:
        """Cotangents of the closed-over values and of the carry before the
        step, from the cotangent `ct` of the carry after it."""
        carry_n = _pick(self.diff_carry, c, False)

        def differentiable_step(h_d: list, c_d: list) -> list:
            hoisted = interleave(self.diff_hoisted, h_d, self.hoisted_n)
            out = self.body.call(
                hoisted, self.refs, *interleave(self.diff_carry, c_d, carry_n)
            )
            return _pick(self.diff_carry, out)

        _, vjp_fn = jax.vjp(
            differentiable_step, self.hoisted_d, _pick(self.diff_carry, c)
        )
        return vjp_fn(ct)


def _backward(
    pullback: _StepPullback,
    steps: jax.Array,
    book: Checkpoints,
    buffer: list,
    ct_carry: list,
    k: int,
) -> tuple[list, list]:
    """Pulls `ct_carry` (the cotangent of the final carry) back through every
    step, recomputing carries from the checkpoints in `buffer`; returns the
    cotangents of the closed-over values and of the initial carry."""

    def advance(c: list, count: jax.Array) -> list:
        return jax.lax.fori_loop(0, count, lambda _, c: pullback.step(c), c)

    def one_action(state: tuple) -> tuple:
        t, book, buffer, ct_h, ct = state
        top = book.used - 1
        start, slot = book.steps[top], book.slots[top]
        free = k - book.used
        count = jnp.where(
            start == t,
            0,
            jnp.where(
                free == 0, t - start, advance_for(t - start + 1, jnp.maximum(free, 1))
            ),
        )
        c = advance([b[slot] for b in buffer], count)
        at_target = start + count == t
        # Not at `t` yet: keep the carry reached as a new checkpoint (the write
        # goes to a free slot, so when at `t` it rewrites that slot's old value).
        push_slot = book.slots[jnp.minimum(book.used, k - 1)]
        buffer = [
            jax.lax.dynamic_update_index_in_dim(
                b, jnp.where(at_target, b[push_slot], x), push_slot, 0
            )
            for b, x in zip(buffer, c)
        ]
        # At `t` straight from the checkpoint: step `t` is done with it, drop it.
        pop = at_target & (count == 0)
        book = Checkpoints(
            book.steps.at[book.used].set(start + count, mode="drop"),
            book.levels,
            book.slots,
            book.used + jnp.where(at_target, 0, 1) - jnp.where(pop, 1, 0),
        )

        def pull_back(operands: tuple) -> tuple:
            c, ct_h, ct = operands
            step_ct_h, ct = pullback.pull_back(c, ct)
            return [a + b for a, b in zip(ct_h, step_ct_h)], ct

        ct_h, ct = jax.lax.cond(
            at_target, pull_back, lambda operands: operands[1:], (c, ct_h, ct)
        )
        return t - jnp.where(at_target, 1, 0), book, buffer, ct_h, ct

    ct_h = [jnp.zeros_like(h) for h in pullback.hoisted_d]
    state = (steps - 1, book, buffer, ct_h, list(ct_carry))
    _, _, _, ct_h, ct = jax.lax.while_loop(lambda s: s[0] >= 0, one_action, state)
    return ct_h, ct
