"""Fixtures for the safetensors tests: a 4 x 2 mesh of the 8 simulated
devices, once with `Auto` and once with `Explicit` axes."""

from __future__ import annotations

import jax
import pytest
from jax.sharding import AxisType


@pytest.fixture(params=[AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
def mesh(request: pytest.FixtureRequest) -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(request.param,) * 2)
