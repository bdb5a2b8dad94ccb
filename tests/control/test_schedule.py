"""The checkpoint schedule of `filter_while_loop(kind="checkpointed")`: the
backward pass's choice of where to place a checkpoint is revolve's optimum,
and a gradient evaluates the body exactly as often as a pure-Python model of
the schedule says."""

from __future__ import annotations

from functools import cache
from math import comb

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx
from filterax._control._schedule import advance_for, empty_checkpoints, store

# --- A pure-Python model of the schedule -------------------------------------------


def _model_advance(length: int, free: int) -> int:
    s, r = free + 1, 0
    while comb(s + r, r) < length:
        r += 1
    fewer = comb(s - 1 + r, r)
    two_back = comb(s + r - 2, r - 2) if r >= 2 else 0
    return min(max(1, two_back, length - fewer), length - 1)


def _model_forward(steps: int, k: int) -> list[int]:
    """The steps whose carries the forward pass keeps (Wang, Moin, Iaccarino)."""
    kept: list[tuple[int, float]] = []
    for i in range(steps):
        if len(kept) < k:
            kept.append((i, float("inf") if i == 0 else 0))
            continue
        later_max, dispensable = -1.0, None
        for j in range(len(kept) - 1, -1, -1):
            if kept[j][1] < later_max:
                dispensable = j
                break
            later_max = max(later_max, kept[j][1])
        if dispensable is not None:
            del kept[dispensable]
            kept.append((i, 0))
        elif k > 1:
            _, level = kept.pop()
            kept.append((i, level + 1))
    return [step for step, _ in kept]


def body_evaluations(steps: int, k: int) -> int:
    """Forward pass + recomputation + one evaluation per step for its VJP."""
    stack, t, recomputed = _model_forward(steps, k), steps - 1, 0
    while t >= 0:
        start = stack[-1]
        if start == t:
            stack.pop()
            t -= 1
            continue
        free = k - len(stack)
        count = t - start if free == 0 else _model_advance(t - start + 1, free)
        recomputed += count
        if start + count == t:
            t -= 1
        else:
            stack.append(start + count)
    return 2 * steps + recomputed


@cache
def _optimal_cost(length: int, free: int) -> int:
    """The fewest recomputed steps to reverse `length` steps from one stored
    carry with `free` more slots (dynamic programming)."""
    if length <= 1:
        return 0
    if free == 0:
        return length * (length - 1) // 2
    return min(
        m + _optimal_cost(length - m, free - 1) + _optimal_cost(m, free)
        for m in range(1, length)
    )


# --- Tests -------------------------------------------------------------------------


def test_advance_is_an_optimal_binomial_choice():
    lengths, frees = np.meshgrid(np.arange(2, 90), np.arange(1, 6))
    lengths, frees = lengths.ravel(), frees.ravel()
    chosen = jax.jit(jax.vmap(advance_for))(
        jnp.asarray(lengths, jnp.int32), jnp.asarray(frees, jnp.int32)
    )
    for length, free, m in zip(lengths, frees, np.asarray(chosen)):
        length, free, m = int(length), int(free), int(m)
        assert m == _model_advance(length, free)
        cost = m + _optimal_cost(length - m, free - 1) + _optimal_cost(m, free)
        assert cost == _optimal_cost(length, free), (length, free, m)


@pytest.mark.parametrize("k", [1, 2, 5])
def test_forward_bookkeeping_matches_the_model(k):
    @jax.jit
    def run(steps):
        def body(i, book):
            return store(book, i)[0]

        return jax.lax.fori_loop(0, steps, body, empty_checkpoints(k))

    for steps in (1, 3, 17, 60):
        book = run(steps)
        used = int(book.used)
        assert list(np.asarray(book.steps[:used])) == _model_forward(steps, k)
        assert sorted(np.asarray(book.slots)) == list(range(k))  # a permutation


@pytest.mark.parametrize("steps, checkpoints", [(1, 4), (13, 1), (40, 3), (300, 8)])
def test_recomputation_follows_the_schedule(steps, checkpoints):
    """Body evaluations of one gradient equal the model's count."""
    evaluations = []

    def loss(w):
        def body(state):
            x, i = state
            jax.debug.callback(lambda: evaluations.append(None))
            return x * w, i + 1

        x, _ = fx.filter_while_loop(
            lambda s: s[1] < steps,
            body,
            (jnp.array(1.0), jnp.array(0)),
            kind="checkpointed",
            checkpoints=checkpoints,
        )
        return x

    grad = jax.jit(jax.grad(loss))(jnp.array(1.01))
    np.testing.assert_allclose(grad, steps * 1.01 ** (steps - 1), rtol=1e-4)
    assert len(evaluations) == body_evaluations(steps, checkpoints)


def test_recomputation_is_n_log_n_with_enough_checkpoints():
    for steps in (1000, 10_000):
        recomputed = body_evaluations(steps, 16) - 2 * steps
        assert recomputed <= steps * np.log2(steps) / 2
