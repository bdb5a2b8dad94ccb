"""The GPT-2 example (`examples/pretrained_gpt2.py`): a model written with
`filterax.nn`, loaded from a file under GPT-2's published names and layout
with `rename` rules and a transpose, computes the logits that GPT-2's own
arithmetic gives on the file's arrays (written out with NumPy here)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from jax.sharding import AxisType, PartitionSpec as P

import filterax as fx

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pretrained_gpt2.py"


@pytest.fixture(scope="module")
def gpt2() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("pretrained_gpt2", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["pretrained_gpt2"] = module  # its Modules are dataclasses
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["pretrained_gpt2"]


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + 1e-5) * weight + bias


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _gpt2_logits(
    t: dict[str, np.ndarray], tokens: np.ndarray, heads: int
) -> np.ndarray:
    """GPT-2's forward pass on its own tensors (Conv1D: `x @ weight + bias`)."""
    t = {name: value.astype(np.float64) for name, value in t.items()}
    length = len(tokens)
    x = t["wte.weight"][tokens] + t["wpe.weight"][:length]
    size = x.shape[-1]
    head = size // heads
    mask = np.tril(np.ones((length, length), bool))
    block = 0
    while f"h.{block}.ln_1.weight" in t:
        h = f"h.{block}."
        a = _layer_norm(x, t[h + "ln_1.weight"], t[h + "ln_1.bias"])
        qkv = a @ t[h + "attn.c_attn.weight"] + t[h + "attn.c_attn.bias"]
        q, k, v = (
            part.reshape(length, heads, head).transpose(1, 0, 2)
            for part in np.split(qkv, 3, axis=-1)
        )
        scores = np.where(mask, q @ k.transpose(0, 2, 1) / np.sqrt(head), -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        mixed = (weights @ v).transpose(1, 0, 2).reshape(length, size)
        x = x + mixed @ t[h + "attn.c_proj.weight"] + t[h + "attn.c_proj.bias"]
        m = _layer_norm(x, t[h + "ln_2.weight"], t[h + "ln_2.bias"])
        m = _gelu(m @ t[h + "mlp.c_fc.weight"] + t[h + "mlp.c_fc.bias"])
        x = x + m @ t[h + "mlp.c_proj.weight"] + t[h + "mlp.c_proj.bias"]
        block += 1
    x = _layer_norm(x, t["ln_f.weight"], t["ln_f.bias"])
    return x @ t["wte.weight"].T


@pytest.mark.parametrize("prefix", ["", "transformer."])
def test_loaded_logits_equal_gpt2s_on_the_files_arrays(
    gpt2: ModuleType, tmp_path: Path, prefix: str
) -> None:
    config = gpt2.TINY
    tensors = gpt2.gpt2_tensors(config, seed=1)
    safetensors.numpy.save_file(
        {prefix + name: value for name, value in tensors.items()},
        tmp_path / "model.safetensors",
    )
    like = fx.filter_eval_shape(gpt2.GPT2, config, key=jax.random.key(0))
    model = gpt2.load_gpt2(str(tmp_path / "model.safetensors"), like)
    tokens = np.array([5, 17, 3, 90, 42, 8])
    logits = np.asarray(model(jnp.asarray(tokens)))
    np.testing.assert_allclose(
        logits, _gpt2_logits(tensors, tokens, config.num_heads), rtol=2e-4, atol=2e-5
    )


def test_the_model_loads_sharded_onto_8_devices(
    gpt2: ModuleType, tmp_path: Path
) -> None:
    config = gpt2.TINY
    safetensors.numpy.save_file(
        gpt2.gpt2_tensors(config, seed=2), tmp_path / "model.safetensors"
    )
    # `Auto` axes: XLA decides the layout of the activations.
    mesh = jax.make_mesh((8,), ("model",), axis_types=(AxisType.Auto,))
    abstract = fx.filter_eval_shape(gpt2.GPT2, config, key=jax.random.key(0))
    rules = [
        (r"\.(qkv|up)\.weight", P("model", None)),
        (r"\.tokens\.weight", P("model")),
    ]
    shardings = fx.sharding_of(abstract, mesh, rules)
    like = jax.tree.map(
        lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
        abstract,
        shardings,
    )
    model = gpt2.load_gpt2(str(tmp_path / "model.safetensors"), like)
    up = model.blocks[1].mlp.up.weight  # loaded transposed, transposed back
    assert up.sharding.is_equivalent_to(shardings.blocks[1].mlp.up.weight, 2)
    assert model.tokens.weight.addressable_shards[0].data.shape == (12, config.size)
    tokens = gpt2.generate(model, [1, 2, 3], 2)
    assert len(tokens) == 5
