"""Properties of generated and wrapped `__init__`s over random class shapes.

A class is drawn as a list of fields (plain, static, converted, `init=False`,
keyword-only), optionally an `InitVar` with `__post_init__`, a
`__check_init__`, and a custom `__init__`. For every shape: construction
stores what the dataclass rules say, JAX's unflatten never runs user code
(converters, checks, `__post_init__`, the custom `__init__`) even with
placeholder leaves, and the round trip keeps the type and every field.
Field values are strings, so that each is one pytree leaf.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import jax.tree_util as jtu
from hypothesis import given, settings, strategies as st

import filterax as fx

_KINDS = ("plain", "static", "converted", "not_init", "kw_only")


def _convert(value: Any) -> Any:
    _CALLS.append("convert")
    return f"converted {value}"


_CALLS: list[str] = []


def _make_class(
    kinds: list[str], init_var: bool, check_init: bool, custom_init: bool
) -> type:
    namespace: dict[str, Any] = {"__annotations__": {}, "__module__": __name__}
    for index, kind in enumerate(kinds):
        name = f"f{index}"
        namespace["__annotations__"][name] = Any
        if kind == "static":
            namespace[name] = fx.field(static=True)
        elif kind == "converted":
            namespace[name] = fx.field(converter=_convert)
        elif kind == "not_init":
            namespace[name] = fx.field(init=False, default=f"unset {index}")
        elif kind == "kw_only":
            namespace[name] = fx.field(kw_only=True)
    if init_var and not custom_init:
        namespace["__annotations__"]["scale"] = dataclasses.InitVar[int]

        def __post_init__(self: Any, scale: int) -> None:
            _CALLS.append(f"post_init {scale}")

        namespace["__post_init__"] = __post_init__
    if check_init:

        def __check_init__(self: Any) -> None:
            _CALLS.append("check")

        namespace["__check_init__"] = __check_init__
    if custom_init:
        names = [f"f{i}" for i, kind in enumerate(kinds) if kind != "not_init"]

        def __init__(self: Any, *values: Any) -> None:
            _CALLS.append("custom init")
            for name, value in zip(names, values, strict=True):
                setattr(self, name, value)

        namespace["__init__"] = __init__
    return type(fx.Module)("Drawn", (fx.Module,), namespace)


def _construct(
    cls: type, kinds: list[str], init_var: bool, custom_init: bool
) -> tuple[Any, dict[str, Any]]:
    """An instance, and the field values it must hold."""
    positional, keyword, expected = [], {}, {}
    for index, kind in enumerate(kinds):
        name, value = f"f{index}", f"value {index}"
        if kind == "not_init":
            expected[name] = f"unset {index}"
            continue
        if kind == "kw_only" and not custom_init:
            keyword[name] = value
        else:
            positional.append(value)
        expected[name] = _convert(value) if kind == "converted" else value
    if init_var and not custom_init:
        keyword["scale"] = 7
    _CALLS.clear()
    return cls(*positional, **keyword), expected


@settings(max_examples=60, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(_KINDS), max_size=4),
    init_var=st.booleans(),
    check_init=st.booleans(),
    custom_init=st.booleans(),
)
def test_construction_and_unflatten_over_random_class_shapes(
    kinds: list[str], init_var: bool, check_init: bool, custom_init: bool
) -> None:
    cls = _make_class(kinds, init_var, check_init, custom_init)
    instance, expected = _construct(cls, kinds, init_var, custom_init)
    assert {name: getattr(instance, name) for name in expected} == expected
    constructed = list(_CALLS)
    assert constructed.count("convert") == kinds.count("converted")
    assert constructed.count("check") == int(check_init)
    assert constructed.count("custom init") == int(custom_init)
    assert constructed.count("post_init 7") == int(init_var and not custom_init)

    _CALLS.clear()
    leaves, treedef = jtu.tree_flatten(instance)
    rebuilt = jtu.tree_unflatten(treedef, leaves)
    placeholders = jtu.tree_map(lambda _: None, instance)
    assert _CALLS == []  # no user code ran on unflatten
    assert type(rebuilt) is cls and type(placeholders) is cls
    assert {name: getattr(rebuilt, name) for name in expected} == expected
    for index, kind in enumerate(kinds):
        value = getattr(placeholders, f"f{index}")
        assert value == expected[f"f{index}"] if kind == "static" else value is None

    if not custom_init:
        # What users pass, and only that: no unflatten-only parameter shows.
        parameters = inspect.signature(cls).parameters
        shown = {f"f{i}" for i, kind in enumerate(kinds) if kind != "not_init"}
        assert set(parameters) == shown | ({"scale"} if init_var else set())
