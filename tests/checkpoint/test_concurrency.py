"""Checkpoints shared between programs: a reader following a writer loses
nothing, a second writer is refused, a program that ends without `wait()`
keeps its last step, and a checkpoint saved by a script run as `__main__`
restores in a program that imports the script's classes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import filterax.checkpoint as fxc

_STEPS = 40

_WRITER = f"""\
import os, sys, time
import jax.numpy as jnp
import filterax.checkpoint as fxc

directory, done = sys.argv[1], sys.argv[2]
with fxc.Checkpointer(directory) as checkpoints:
    for step in range({_STEPS}):
        checkpoints.save(step, {{"w": jnp.full((64,), float(step)), "step": step}})
        if step == 0:
            print("writing", flush=True)
    checkpoints.wait()
    print("written", flush=True)
    while not os.path.exists(done):  # holds the directory until told
        time.sleep(0.01)
"""


def _run(script: Path, *args: str, timeout: float = 120) -> str:
    result = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=script.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_a_reader_opening_the_directory_never_loses_a_writers_step(
    tmp_path: Path,
) -> None:
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    directory = tmp_path / "run"
    done = tmp_path / "done"
    writer = subprocess.Popen(
        [sys.executable, str(script), str(directory), str(done)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline() == "writing\n"
        seen: list[list[int]] = []
        for _ in range(15):  # an evaluation loop, reopening every time
            with fxc.Checkpointer(directory) as reader:
                steps = reader.steps()
                seen.append(steps)
                if steps:
                    latest = reader.restore(
                        {"w": jnp.zeros(64), "step": 0}, step=steps[-1]
                    )
                    assert latest["step"] == steps[-1]
                    assert np.array_equal(latest["w"], np.full(64, steps[-1]))
            time.sleep(0.05)
        # A second writer is refused while the first holds the directory.
        with fxc.Checkpointer(directory) as second:
            with pytest.raises(
                RuntimeError,
                match=rf"{directory} is being written.*process {writer.pid}",
            ):
                second.save(10_000, {"w": jnp.zeros(64), "step": 0})
        assert writer.stdout.readline() == "written\n"
    finally:
        done.touch()
        try:
            code = writer.wait(60)
        finally:
            if writer.poll() is None:
                os.killpg(writer.pid, 9)
                writer.wait()
            errors = writer.stderr.read() if writer.stderr else ""
            for stream in (writer.stdout, writer.stderr):
                if stream is not None:
                    stream.close()
    assert code == 0, errors
    # Steps only ever appeared, complete: what a reader saw stays.
    for earlier, later in zip(seen, seen[1:]):
        assert set(earlier) <= set(later)
    with fxc.Checkpointer(directory) as reader:
        assert reader.steps() == list(range(_STEPS))
        for step in range(_STEPS):
            restored = reader.restore({"w": jnp.zeros(64), "step": 0}, step=step)
            assert restored["step"] == step
            assert np.array_equal(restored["w"], np.full(64, step))
    assert sorted(os.listdir(directory), key=int) == [str(s) for s in range(_STEPS)]


_TRAIN = """\
import sys
import jax
import filterax as fx
import filterax.checkpoint as fxc


class Transformer(fx.Module):
    layers: list
    width: int = fx.field(static=True)

    def __init__(self, width, *, key):
        keys = jax.random.split(key, 2)
        self.width = width
        self.layers = [fx.nn.Linear(4, width, key=keys[0]),
                       fx.nn.Linear(width, 2, key=keys[1])]


if __name__ == "__main__":
    checkpoints = fxc.Checkpointer(sys.argv[1])
    for step in (1, 2):
        checkpoints.save(step, Transformer(8, key=jax.random.key(step)))
    # No wait() and no close(): the program ends with step 2 in flight.
"""

_EVALUATE = """\
import sys
import jax
import filterax as fx
import filterax.checkpoint as fxc
from train import Transformer

like = fx.filter_eval_shape(Transformer, int(sys.argv[2]), key=jax.random.key(0))
with fxc.Checkpointer(sys.argv[1]) as checkpoints:
    print(checkpoints.steps())
    try:
        model = checkpoints.restore(like)
    except fx.SerialisationError as error:
        print(error)
    else:
        print(bool(fx.tree_equal(model, Transformer(8, key=jax.random.key(2)))))
"""


def test_a_main_script_checkpoint_restores_where_its_classes_are_imported(
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent(_TRAIN))
    (tmp_path / "evaluate.py").write_text(textwrap.dedent(_EVALUATE))
    directory = str(tmp_path / "run")
    _run(tmp_path / "train.py", directory)
    # The save still in flight at exit was finished, not lost.
    assert sorted(os.listdir(directory)) == ["1", "2"]
    lines = _run(tmp_path / "evaluate.py", directory, "8").splitlines()
    assert lines == ["[1, 2]", "True"]
    wider = _run(tmp_path / "evaluate.py", directory, "16").splitlines()
    assert wider[0] == "[1, 2]"
    assert ".width (a static field of Transformer): checkpoint 8, like 16" in wider[1]
