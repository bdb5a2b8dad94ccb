"""Matching a file's names with `like`'s: `rename` rules, `strict`, and the
errors for names and shapes that do not match."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

import filterax as fx
import filterax.safetensors as fxs


class Block(fx.Module):
    up: fx.nn.Linear
    down: fx.nn.Linear


class Net(fx.Module):
    blocks: list[Block]
    norm: fx.nn.LayerNorm


def _net() -> Net:
    keys = jax.random.split(jax.random.key(0), 4)
    blocks = [
        Block(
            fx.nn.Linear(2, 3, key=keys[2 * i]), fx.nn.Linear(3, 2, key=keys[2 * i + 1])
        )
        for i in range(2)
    ]
    return Net(blocks, fx.nn.LayerNorm(2))


def _published(path: Path, **extra: np.ndarray) -> dict[str, np.ndarray]:
    """A file under another naming scheme, as published checkpoints have."""
    generator = np.random.default_rng(0)
    tensors = {}
    for i in range(2):
        tensors[f"transformer.h.{i}.fc_in.weight"] = generator.random(
            (3, 2), np.float32
        )
        tensors[f"transformer.h.{i}.fc_in.bias"] = generator.random(3, np.float32)
        tensors[f"transformer.h.{i}.fc_out.weight"] = generator.random(
            (2, 3), np.float32
        )
        tensors[f"transformer.h.{i}.fc_out.bias"] = generator.random(2, np.float32)
    tensors["transformer.ln_f.weight"] = generator.random(2, np.float32)
    tensors["transformer.ln_f.bias"] = generator.random(2, np.float32)
    tensors.update(extra)
    safetensors.numpy.save_file(tensors, path)
    return tensors


RULES = [
    (r"^transformer\.", ""),
    (r"^h\.(\d+)\.", r"blocks.\1."),
    (r"\.fc_in\.", ".up."),
    (r"\.fc_out\.", ".down."),
    (r"^ln_f\.", "norm."),
]


def test_rename_rules_map_published_names_onto_key_paths(tmp_path: Path) -> None:
    tensors = _published(tmp_path / "p.safetensors")
    net = fxs.load(tmp_path / "p.safetensors", _net(), rename=RULES)
    np.testing.assert_array_equal(
        net.blocks[1].down.weight, tensors["transformer.h.1.fc_out.weight"]
    )
    np.testing.assert_array_equal(net.norm.bias, tensors["transformer.ln_f.bias"])


def test_rename_rules_apply_in_order(tmp_path: Path) -> None:
    safetensors.numpy.save_file(
        {"a": np.ones(2, np.float32)}, tmp_path / "a.safetensors"
    )
    # "a" -> "b" -> "c": the second rule sees the first one's result.
    loaded = fxs.load(
        tmp_path / "a.safetensors", {"c": jnp.zeros(2)}, rename=[("a", "b"), ("b", "c")]
    )
    np.testing.assert_array_equal(loaded["c"], 1.0)
    compiled = [(re.compile("^a$"), "c")]
    assert (
        float(
            fxs.load(tmp_path / "a.safetensors", {"c": jnp.zeros(2)}, rename=compiled)[
                "c"
            ][0]
        )
        == 1.0
    )


def test_strict_lists_every_missing_and_unused_name_in_one_error(
    tmp_path: Path,
) -> None:
    _published(tmp_path / "p.safetensors", **{"transformer.h.0.attn.bias": np.ones(4)})
    # Without the rule for `ln_f`: two leaves miss, two tensors are unused.
    with pytest.raises(fx.SerialisationError) as error:
        fxs.load(tmp_path / "p.safetensors", _net(), rename=RULES[:-1])
    message = str(error.value)
    assert "p.safetensors does not match `like` by name" in message
    assert (
        "2 leaf(s) of `like` with no tensor: 'norm.weight' (at .norm.weight), "
        in message
    )
    assert "'norm.bias' (at .norm.bias)" in message
    assert "3 tensor(s) matching no leaf: " in message
    for name in ("ln_f.weight", "ln_f.bias"):
        assert f"{name!r} (from 'transformer.{name}')" in message
    assert "'blocks.0.attn.bias' (from 'transformer.h.0.attn.bias')" in message


def test_not_strict_keeps_likes_values_and_warns(tmp_path: Path) -> None:
    tensors = _published(tmp_path / "p.safetensors", extra=np.ones(4))
    like = _net()
    with pytest.warns(fx.FilteraxWarning, match=r"(?s)'norm.weight'.*'extra'.*keep"):
        net = fxs.load(
            tmp_path / "p.safetensors", like, rename=RULES[:-1], strict=False
        )
    assert net.norm.weight is like.norm.weight
    np.testing.assert_array_equal(
        net.blocks[0].up.bias, tensors["transformer.h.0.fc_in.bias"]
    )


def test_a_shape_mismatch_names_the_tensor_the_key_path_and_both_shapes(
    tmp_path: Path,
) -> None:
    _published(tmp_path / "p.safetensors")
    like = fx.tree_at(lambda n: n.blocks[1].up.weight, _net(), jnp.zeros((3, 5)))
    with pytest.raises(fx.SerialisationError) as error:
        fxs.load(tmp_path / "p.safetensors", like, rename=RULES, strict=False)
    assert (
        "the tensor 'blocks.1.up.weight' (from 'transformer.h.1.fc_in.weight') has "
        "shape (3, 2), but the leaf at .blocks[1].up.weight has shape (3, 5)"
    ) in str(error.value)


def test_renaming_two_tensors_to_one_name_is_an_error(tmp_path: Path) -> None:
    _published(tmp_path / "p.safetensors")
    with pytest.raises(fx.SerialisationError, match="'transformer.h.0.fc_in.bias' and"):
        fxs.load(tmp_path / "p.safetensors", _net(), rename=[(r"\.fc_\w+\.", ".up.")])


def test_rename_must_be_pairs_of_regex_and_replacement(tmp_path: Path) -> None:
    _published(tmp_path / "p.safetensors")
    with pytest.raises(
        TypeError, match=r"rename\[0\] must be a \(regex, replacement\)"
    ):
        fxs.load(tmp_path / "p.safetensors", _net(), rename=["transformer"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"rename\[1\]: '\(' is no regex"):
        fxs.load(tmp_path / "p.safetensors", _net(), rename=[("a", "b"), ("(", "")])
