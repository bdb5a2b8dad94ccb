"""`filterax.checkpoint.Checkpointer`: numbered steps saved while training goes
on, the newest kept, a step visible only once complete, resume after a crash."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx
import filterax.checkpoint as fxc


def _params(value: float) -> dict[str, jax.Array]:
    return {"w": jnp.full((4,), value), "b": jnp.full((2,), -value)}


def test_keeps_the_newest_steps_and_restores_any_of_them(tmp_path: Path) -> None:
    with fxc.Checkpointer(tmp_path, keep=2) as checkpoints:
        assert checkpoints.steps() == [] and checkpoints.latest_step() is None
        for step in (1, 2, 5):
            checkpoints.save(step, _params(step))
        checkpoints.wait()
        assert checkpoints.steps() == [2, 5]
        assert checkpoints.latest_step() == 5
        latest = checkpoints.restore(_params(0))
        older = checkpoints.restore(_params(0), step=2)
    assert np.array_equal(latest["w"], np.full(4, 5.0))
    assert np.array_equal(older["b"], np.full(2, -2.0))
    assert sorted(os.listdir(tmp_path)) == ["2", "5"]


def test_another_checkpointer_sees_the_steps_on_disk(tmp_path: Path) -> None:
    with fxc.Checkpointer(tmp_path) as checkpoints:
        checkpoints.save(3, _params(3), wait=True)
    with fxc.Checkpointer(tmp_path) as reopened:
        assert reopened.steps() == [3]
        assert np.array_equal(reopened.restore(_params(0))["w"], np.full(4, 3.0))


def test_steps_must_increase(tmp_path: Path) -> None:
    with fxc.Checkpointer(tmp_path) as checkpoints:
        checkpoints.save(4, _params(4), wait=True)
        for step in (4, 3):
            with pytest.raises(ValueError, match=f"cannot save step {step}.*step 4"):
                checkpoints.save(step, _params(step))
        with pytest.raises(ValueError, match="non-negative"):
            checkpoints.save(-1, _params(0))
        assert checkpoints.steps() == [4]


def test_restore_of_a_missing_step(tmp_path: Path) -> None:
    with fxc.Checkpointer(tmp_path) as checkpoints:
        with pytest.raises(FileNotFoundError, match="no complete step"):
            checkpoints.restore(_params(0))
        checkpoints.save(1, _params(1), wait=True)
        with pytest.raises(FileNotFoundError, match=r"step 7 .*\[1\]"):
            checkpoints.restore(_params(0), step=7)


def test_keep_must_be_positive(tmp_path: Path) -> None:
    for keep in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="keep must be a positive int"):
            fxc.Checkpointer(tmp_path, keep=keep)  # type: ignore[arg-type]


def test_close_waits_and_a_closed_checkpointer_refuses_work(tmp_path: Path) -> None:
    checkpoints = fxc.Checkpointer(tmp_path)
    checkpoints.save(1, _params(1))
    checkpoints.close()
    checkpoints.close()
    assert os.listdir(tmp_path) == ["1"]
    with pytest.raises(ValueError, match="closed"):
        checkpoints.steps()


def test_training_goes_on_while_a_step_is_written(
    tmp_path: Path, held_writes: threading.Event
) -> None:
    @fx.filter_jit(donate="all")
    def train_step(params: dict[str, jax.Array]) -> dict[str, jax.Array]:
        return jax.tree.map(lambda x: x + 1, params)

    params = _params(1)
    with fxc.Checkpointer(tmp_path) as checkpoints:
        checkpoints.save(1, params)
        # `save` has returned and the write is held back: the step is not
        # visible yet, and the training step runs (donating the saved arrays).
        assert checkpoints.steps() == [] and os.listdir(tmp_path) != ["1"]
        params = train_step(params)
        assert np.array_equal(params["w"], np.full(4, 2.0))
        assert checkpoints.steps() == []
        held_writes.set()
        checkpoints.wait()
        assert checkpoints.steps() == [1]
        restored = checkpoints.restore(_params(0))
    assert np.array_equal(restored["w"], np.full(4, 1.0))  # the values at save


_WRITER = """\
import sys, threading
import jax.numpy as jnp
import orbax.checkpoint as ocp
import filterax.checkpoint as fxc

checkpoints = fxc.Checkpointer(sys.argv[1])
checkpoints.save(1, {"w": jnp.full((4,), 1.0)}, wait=True)
never, reached = threading.Event(), threading.Event()

async def stalled(self, item, directory):  # step 2 never completes
    reached.set()  # its partial directory exists by now
    never.wait()

ocp.JsonCheckpointHandler._save_fn = stalled
checkpoints.save(2, {"w": jnp.full((4,), 2.0)})
reached.wait()
print("saving step 2", flush=True)
never.wait()
"""


def test_a_writer_killed_mid_save_leaves_the_previous_step(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent(_WRITER))
    directory = tmp_path / "run"
    writer = subprocess.Popen(
        [sys.executable, str(script), str(directory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline() == "saving step 2\n"
    finally:
        os.killpg(writer.pid, signal.SIGKILL)
        writer.wait()
        if writer.stdout is not None:
            writer.stdout.close()
    left = sorted(os.listdir(directory))
    assert "1" in left and "2" not in left
    assert any(name.startswith("2.") for name in left)  # the partial step

    with fxc.Checkpointer(directory) as checkpoints:
        assert checkpoints.steps() == [1]
        resumed = checkpoints.restore({"w": jnp.zeros(4)})
        assert np.array_equal(resumed["w"], np.full(4, 1.0))
        checkpoints.save(2, {"w": jnp.full((4,), 2.0)}, wait=True)
        assert checkpoints.steps() == [1, 2]
    assert sorted(os.listdir(directory)) == ["1", "2"]
