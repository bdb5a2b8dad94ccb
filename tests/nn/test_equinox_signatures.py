"""Every public callable of `filterax.nn` takes the parameters of its
`equinox.nn` namesake: the same names, kinds and defaults, for constructors,
functions, `__call__` and public methods (issue 39). Annotations are not
compared. The differences that remain are listed in `ACCEPTED` (and in
`docs/migration.md`), each with its reason.

Equinox is not a test dependency: without it these tests are skipped, unless
`FILTERAX_EQUINOX_REQUIRED` is set (CI sets it where the `examples` extra,
which installs diffrax and so Equinox, is installed), and then they run or
fail.
"""

from __future__ import annotations

import importlib
import inspect
import os
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import filterax as fx

ROOT = Path(__file__).resolve().parents[2]


def _equinox_nn() -> types.ModuleType:
    if os.environ.get("FILTERAX_EQUINOX_REQUIRED"):
        return importlib.import_module("equinox.nn")
    return pytest.importorskip("equinox.nn")


# `(where, parameter)` -> why the difference is accepted. `where` is a name of
# `filterax.nn`, or `Name.method`.
ACCEPTED: dict[tuple[str, str], str] = {
    **{
        (layer, parameter): (
            "an int default where Equinox's is the same int for each spatial "
            "dimension: the same layer"
        )
        for layer, parameters in {
            "Conv2d": ("stride", "padding", "dilation"),
            "Conv3d": ("stride", "padding", "dilation"),
            "ConvTranspose2d": ("stride", "output_padding", "padding", "dilation"),
            "ConvTranspose3d": ("stride", "output_padding", "padding", "dilation"),
        }.items()
        for parameter in parameters
    },
    ("MLP", "final_activation"): (
        "the identity function by default in both, as different function objects"
    ),
    ("RotaryPositionalEmbedding", "dtype"): (
        "`None` meaning the default floating dtype, where Equinox's dataclass "
        "default is a factory giving it"
    ),
    **{
        (f"{layer}.__call__", "state"): (
            "each library's own private 'no state passed' sentinel as the default"
        )
        for layer in ("GroupNorm", "LayerNorm", "RMSNorm", "Sequential")
    },
}

# Names and methods Equinox has that filterax's namesake does not.
ACCEPTED_MISSING_METHODS: dict[str, str] = {
    "State.tree_flatten": "Equinox's pytree registration hooks; State is a pytree",
    "State.tree_unflatten": "Equinox's pytree registration hooks; State is a pytree",
}

# Public names of `filterax.nn` that Equinox does not have.
FILTERAX_ONLY = {"Stacked": "filterax's stacked layers (scan over depth)"}


def _is_axes(parameter: inspect.Parameter) -> bool:
    """filterax's extra `axes=` keyword (the named sharding axes of a layer's
    parameters): keyword-only, `None` by default. Accepted everywhere."""
    return (
        parameter.name == "axes"
        and parameter.kind is inspect.Parameter.KEYWORD_ONLY
        and parameter.default is None
    )


def _pairs(equinox_nn: types.ModuleType) -> Iterator[tuple[str, Any, Any]]:
    """`(where, filterax callable, Equinox callable)` for every public callable
    of `filterax.nn` and, for classes, their `__call__` and public methods."""
    for name in sorted(fx.nn.__all__):
        ours = getattr(fx.nn, name)
        if not callable(ours) or name in FILTERAX_ONLY:
            continue
        theirs = getattr(equinox_nn, name)
        yield name, ours, theirs
        if isinstance(ours, type):
            for method in sorted(vars(theirs).keys() | {"__call__"}):
                if method.startswith("_") and method != "__call__":
                    continue
                if not any(method in vars(klass) for klass in theirs.__mro__):
                    continue  # not the class's (`__call__` of the metaclass)
                their_method = getattr(theirs, method, None)
                if not callable(their_method) or isinstance(their_method, type):
                    continue
                our_method = getattr(ours, method, None)
                yield f"{name}.{method}", our_method, their_method


def _default_differs(ours: Any, theirs: Any) -> bool:
    if ours is theirs:
        return False
    try:
        return type(ours) is not type(theirs) or bool(ours != theirs)
    except Exception:  # noqa: BLE001 - not comparable: different
        return True


def _differences(where: str, ours: Callable, theirs: Callable) -> list[str]:
    """What differs between the two signatures, as `where(parameter): ...`."""
    our_parameters = [
        p for p in inspect.signature(ours).parameters.values() if not _is_axes(p)
    ]
    their_parameters = list(inspect.signature(theirs).parameters.values())
    found = []
    for ours_p, theirs_p in zip(our_parameters, their_parameters):
        if ours_p.name != theirs_p.name:
            found.append(f"{where}({ours_p.name}): Equinox names it {theirs_p.name}")
        elif ours_p.kind is not theirs_p.kind:
            found.append(f"{where}({ours_p.name}): {ours_p.kind} vs {theirs_p.kind}")
        elif _default_differs(ours_p.default, theirs_p.default):
            found.append(
                f"{where}({ours_p.name}): default {ours_p.default!r} vs "
                f"Equinox's {theirs_p.default!r}"
            )
    if len(our_parameters) != len(their_parameters):
        found.append(
            f"{where}: parameters {[p.name for p in our_parameters]} vs "
            f"Equinox's {[p.name for p in their_parameters]}"
        )
    return found


def _accepted(difference: str) -> bool:
    where, _, rest = difference.partition("(")
    parameter = rest.partition(")")[0]
    return (where, parameter) in ACCEPTED


def test_every_public_nn_callable_has_equinoxs_signature():
    equinox_nn = _equinox_nn()
    found = []
    for where, ours, theirs in _pairs(equinox_nn):
        if ours is None:
            if where not in ACCEPTED_MISSING_METHODS:
                found.append(f"{where}: missing")
            continue
        found += [d for d in _differences(where, ours, theirs) if not _accepted(d)]
    assert found == []


def test_each_accepted_difference_still_differs():
    # An entry that no longer differs is stale: remove it here and from the
    # migration guide, which lists every one.
    equinox_nn = _equinox_nn()
    differing = set()
    for where, ours, theirs in _pairs(equinox_nn):
        if ours is not None:
            for difference in _differences(where, ours, theirs):
                where_, _, rest = difference.partition("(")
                differing.add((where_, rest.partition(")")[0]))
    assert sorted(set(ACCEPTED) - differing) == []


def test_only_the_listed_names_are_filteraxs_own():
    equinox_nn = _equinox_nn()
    ours = {name for name in fx.nn.__all__ if callable(getattr(fx.nn, name))}
    assert sorted(name for name in ours if not hasattr(equinox_nn, name)) == sorted(
        FILTERAX_ONLY
    )


def test_every_layer_taking_axes_is_accepted_only_for_that_keyword():
    # `axes=` comes last, after `key=` where there is one, so a call written
    # for Equinox binds exactly as it does there.
    _equinox_nn()
    taking_axes = []
    for name in fx.nn.__all__:
        ours = getattr(fx.nn, name)
        if not isinstance(ours, type):
            continue
        parameters = list(inspect.signature(ours).parameters.values())
        if any(_is_axes(p) for p in parameters):
            assert _is_axes(parameters[-1]), name
            taking_axes.append(name)
    assert "Linear" in taking_axes and "Conv2d" in taking_axes


def test_inference_mode_takes_pytree_by_keyword_as_in_equinox():
    model = fx.nn.Sequential([fx.nn.Dropout(0.5)])
    assert fx.nn.inference_mode(pytree=model)[0].inference is True
    assert fx.nn.inference_mode(pytree=model, value=False)[0].inference is False


def test_batch_norm_mode_defaults_to_legacy_as_in_equinox():
    assert inspect.signature(fx.nn.BatchNorm).parameters["mode"].default == "legacy"


def test_the_migration_guide_lists_every_accepted_difference():
    page = (ROOT / "docs" / "migration.md").read_text(encoding="utf-8")
    section = page.split("## Signatures that differ from Equinox's", 1)[1]
    section = section.split("\n## ", 1)[0]
    for where, parameter in [*ACCEPTED, ("*", "axes")]:
        name = where.split(".")[0]
        assert f"`{name}" in section or where == "*", where
        assert f"`{parameter}" in section, (where, parameter)
    for entry in [*ACCEPTED_MISSING_METHODS, *FILTERAX_ONLY]:
        assert f"`{entry}" in section, entry
