"""A griffe extension that shows private default values by what they mean.

Some public signatures default to a private object: `nn.MLP`'s
`final_activation=_identity`, `filter_vmap`'s `in_axes=DEFAULT_AXES`,
`tree_at`'s `replace=_MISSING`. The API pages should show what such a default
means, in names a user can write, not the library's private spelling. This
extension rewrites those default expressions while mkdocstrings collects the
API; the library source is untouched.

`MEANINGS` maps the canonical path of each such default (where the object is
defined, as griffe resolves it) to the text the pages show. The text must be
valid Python (mkdocstrings formats long signatures with Ruff, which skips
anything it cannot parse) and use only public names. A default that names an
unlisted private object stays as it is, and `docs/scripts/check_signatures.py`
(run on the built site by `.ci/run`) fails on it until it is listed here.

Loaded from `mkdocs.yml` (`extensions:` of the mkdocstrings Python handler).
"""

from __future__ import annotations

from typing import Any

import griffe

MEANINGS: dict[str, str] = {
    # The identity function, as Equinox documents it.
    "filterax.nn._mlp._identity": "lambda x: x",
    # Map every array leaf over axis 0, broadcast everything else.
    "filterax._mapping._axes.DEFAULT_AXES": "if_array(0)",
    # `tree_at` takes exactly one of `replace` and `replace_fn`: the other one is
    # not given. `...` is the stub-file spelling of "has a default".
    "filterax._tree._utilities._MISSING": "...",
    # Truncate nothing.
    "filterax._pretty._never": "lambda leaf: False",
}


class PublicDefaults(griffe.Extension):
    """Replaces each private default listed in `MEANINGS` by its meaning."""

    def on_function(self, *, func: griffe.Function, **kwargs: Any) -> None:
        for parameter in func.parameters:
            default = parameter.default
            if isinstance(default, griffe.ExprName):
                parameter.default = MEANINGS.get(default.canonical_path, default)
