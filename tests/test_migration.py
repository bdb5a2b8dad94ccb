"""Porting from Equinox is an import change: every public name of Equinox 0.13.8
(listed here as names, not imported from Equinox) is provided by filterax, or
listed in the migration guide's table of names filterax does not have, and
asking for such a name says so."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import filterax as fx

ROOT = Path(__file__).resolve().parent.parent

EQUINOX_NAMES = {
    "filterax": """
        AbstractClassVar AbstractVar Enumeration EquinoxRuntimeError
        EquinoxTracetimeError Module Partial StrictConfig apply_updates
        branched_error_if clear_caches combine debug default_deserialise_filter_spec
        default_serialise_filter_spec error_if field filter filter_checkpoint
        filter_closure_convert filter_custom_jvp filter_custom_vjp filter_eval_shape
        filter_grad filter_hessian filter_jacfwd filter_jacrev filter_jit filter_jvp
        filter_make_jaxpr filter_pmap filter_pure_callback filter_shard
        filter_value_and_grad filter_vjp filter_vmap if_array internal is_array
        is_array_like is_inexact_array is_inexact_array_like module_update_wrapper nn
        partition static_field tree_at tree_check tree_deserialise_leaves tree_equal
        tree_flatten_one_level tree_inference tree_pformat tree_pprint
        tree_serialise_leaves
    """.split(),
    "filterax.nn": """
        AdaptiveAvgPool1d AdaptiveAvgPool2d AdaptiveAvgPool3d AdaptiveMaxPool1d
        AdaptiveMaxPool2d AdaptiveMaxPool3d AdaptivePool AvgPool1d AvgPool2d
        AvgPool3d BatchNorm Conv Conv1d Conv2d Conv3d ConvTranspose ConvTranspose1d
        ConvTranspose2d ConvTranspose3d Dropout Embedding GRUCell GroupNorm Identity
        LSTMCell Lambda LayerNorm Linear MLP MaxPool1d MaxPool2d MaxPool3d
        MultiheadAttention PReLU Pool RMSNorm RotaryPositionalEmbedding Sequential
        Shared SpectralNorm State StateIndex StatefulLayer WeightNorm
        delete_init_state inference_mode make_with_state
    """.split(),
    "filterax.debug": """
        announce_transform assert_max_traces backward_nan breakpoint_if
        get_num_traces inspect_dce store_dce
    """.split(),
}
NAMESPACES = {"filterax": fx, "filterax.nn": fx.nn, "filterax.debug": fx.debug}


def _listed_as_missing() -> set[str]:
    """The names in the migration guide's table of names filterax lacks."""
    page = (ROOT / "docs" / "migration.md").read_text(encoding="utf-8")
    section = page.split("## Equinox names filterax does not have", 1)[1]
    section = section.split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([\w.]+)` \|", section, re.M))


def _qualified(namespace: str, name: str) -> str:
    return name if namespace == "filterax" else f"{namespace.split('.')[1]}.{name}"


@pytest.mark.parametrize(
    "namespace, name",
    [(namespace, name) for namespace, names in EQUINOX_NAMES.items() for name in names],
)
def test_every_equinox_name_is_provided_or_listed_as_missing(namespace, name):
    module = NAMESPACES[namespace]
    missing = _listed_as_missing()
    if _qualified(namespace, name) in missing:
        with pytest.raises(AttributeError, match="migration guide"):
            getattr(module, name)
    else:
        assert hasattr(module, name), (
            f"{namespace}.{name} is neither provided nor listed"
        )


def test_the_missing_table_lists_only_names_filterax_lacks():
    for entry in _listed_as_missing():
        namespace, _, name = entry.rpartition(".")
        module = NAMESPACES["filterax" if not namespace else f"filterax.{namespace}"]
        assert not hasattr(module, name), f"{entry} is listed as missing but provided"


def test_an_unknown_name_is_a_plain_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'not_a_name'"):
        fx.not_a_name  # noqa: B018
