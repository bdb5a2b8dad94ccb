"""What the processes of a multi-process run tell one another about a save:
agreement on the step and the tree before anything is written, and barriers
with a time limit, through the key-value store of JAX's distributed runtime
(as orbax reaches it).

In a one-process run every function here returns at once.

Imports `jax`, `orbax.checkpoint` and the checkpoint's `_describe.py`.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import jax
import orbax.checkpoint as ocp

from ._describe import digest, first_difference

__all__ = ["AGREEMENT_SECONDS", "agree", "barrier", "next_save_number"]

# How long a process waits for the others to reach the same save.
AGREEMENT_SECONDS = 30
# How long a process waits for the others to finish writing their files.
_WRITE_SECONDS = 3600
_SAVES = itertools.count()
_PREFIX = "filterax/checkpoint"


def next_save_number() -> int:
    """The number of this save among this process's saves: the same on every
    process, since every process makes the same calls."""
    return next(_SAVES)


def _client() -> Any:
    return ocp.multihost.get_jax_distributed_client()


def _get(client: Any, key: str, seconds: int, what: str) -> str:
    try:
        return client.blocking_key_value_get(key, seconds * 1000)
    except Exception as error:  # the runtime raises its own error types
        raise TimeoutError(f"{what} within {seconds} s ({error}).") from None


def agree(
    number: int,
    where: str,
    step: int | None,
    records: list[dict[str, Any]],
    token: str,
    refusal: str | None,
) -> str:
    """Checks, before anything is written, that every process saves the same
    step of the same tree; returns the primary process's `token`. Raises on
    every process, within `AGREEMENT_SECONDS`, when they differ (naming the two
    steps, or the first differing key path), when one refused the save
    (`refusal`, say another writer holds the directory), or when one does not
    come."""
    count = jax.process_count()
    if count == 1:
        if refusal is not None:
            raise RuntimeError(refusal)
        return token
    me = jax.process_index()
    client = _client()
    key = f"{_PREFIX}/{number}/agree"
    mine = {"step": step, "digest": digest(records), "token": token, "refusal": refusal}
    client.key_value_set(f"{key}/{me}", json.dumps(mine))
    theirs: dict[int, dict[str, Any]] = {}
    for other in range(count):
        theirs[other] = json.loads(
            _get(
                client,
                f"{key}/{other}",
                AGREEMENT_SECONDS,
                f"process {other} did not reach the save of {where}",
            )
        )
    for other, record in theirs.items():
        if record["refusal"] is not None:
            raise RuntimeError(
                record["refusal"]
                + ("" if other == me else f" (as process {other} found)")
            )
    steps = {other: record["step"] for other, record in theirs.items()}
    if len(set(steps.values())) > 1:
        different = [other for other in steps if steps[other] != steps[0]][0]
        raise ValueError(
            f"the processes disagree on the step saved in {where}: process 0 "
            f"saves step {steps[0]}, process {different} step {steps[different]}. "
            "Every process must make the same save calls."
        )
    digests = {other: record["digest"] for other, record in theirs.items()}
    if len(set(digests.values())) > 1:
        other = next(o for o in range(count) if digests[o] != digests[me])
        client.key_value_set(f"{key}/{me}/tree", json.dumps(records))
        their_records = json.loads(
            _get(
                client,
                f"{key}/{other}/tree",
                AGREEMENT_SECONDS,
                f"process {other} did not describe its tree for {where}",
            )
        )
        low, high = sorted((me, other))
        low_records, high_records = (
            (records, their_records) if low == me else (their_records, records)
        )
        problem = first_difference(
            low_records, high_records, f"process {low}", f"process {high}"
        )
        raise ValueError(
            f"the processes save different trees in {where}: {problem}. Every "
            "process must save a tree of the same structure, kinds, shapes and "
            "dtypes."
        )
    return str(theirs[0]["token"])


def barrier(number: int, name: str, where: str, failure: str | None = None) -> None:
    """Waits until every process has reached stage `name` of save `number`;
    raises on every other process if one reached it failing (`failure`: what
    went wrong there), rather than leaving them waiting."""
    if jax.process_count() == 1:
        return
    client = _client()
    key = f"{_PREFIX}/{number}/{name}"
    client.key_value_set(f"{key}/{jax.process_index()}", failure or "")
    for other in range(jax.process_count()):
        problem = _get(
            client,
            f"{key}/{other}",
            _WRITE_SECONDS,
            f"process {other} did not finish writing {where}",
        )
        if problem and other != jax.process_index():
            raise RuntimeError(
                f"the save of {where} failed on process {other}: {problem}"
            )
