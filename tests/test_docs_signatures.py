"""The check that API pages show only public names in signatures
(`docs/scripts/check_signatures.py`, run by `.ci/run` on the built site), and
the table of meanings it relies on (`docs/scripts/griffe_public_defaults.py`).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "docs" / "scripts"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = _load("check_signatures")
ALLOWED = check.public_names()

# What mkdocstrings writes for one signature (abridged, highlighted spans kept).
PAGE = """
<h2 id="filterax.nn.MLP">MLP</h2>
<div class="doc-signature highlight"><pre><span></span><code><a id="l1" href="#l1"></a><span class="nf">MLP</span><span class="p">(</span>
<a id="l2" href="#l2"></a>    <span class="n">in_size</span><span class="p">,</span>
<a id="l3" href="#l3"></a>    <span class="n">final_activation</span><span class="o">=</span><span class="n">_identity</span><span class="p">,</span>
<a id="l4" href="#l4"></a><span class="p">)</span>
</code></pre></div>
<div class="doc-contents"><p>A multi-layer perceptron &amp; more.</p></div>
<div class="doc-signature highlight"><pre><code>tree_at(where, pytree, replace=...)</code></pre></div>
"""


def test_signatures_are_read_from_the_rendered_blocks() -> None:
    found = check.signatures(PAGE)
    assert len(found) == 2
    assert " ".join(found[0].split()) == "MLP( in_size, final_activation=_identity, )"
    assert found[1] == "tree_at(where, pytree, replace=...)"


@pytest.mark.parametrize(
    "signature",
    [
        "filter_vmap(fun=None, *, in_axes=if_array(0), **vmap_kwargs)",
        "MLP(in_size, activation=jax.nn.relu, final_activation=lambda x: x)",
        "tree_at(where, pytree, replace=..., replace_fn=..., is_leaf=None)",
        "error_if(x, pred, msg, *, on_error='default')",
        "tree_serialise_leaves(path, pytree, filter_spec=default_serialise_filter_spec)",
        "Conv(num_spatial_dims, padding_mode='ZEROS', dtype=jnp.float32, *, key)",
        "deterministic",
        "EquinoxRuntimeError = FilteraxRuntimeError",
    ],
)
def test_public_defaults_pass(signature: str) -> None:
    assert check.problems(signature, ALLOWED) == []


@pytest.mark.parametrize(
    ("signature", "problem"),
    [
        ("MLP(in_size, final_activation=_identity)", "private name '_identity'"),
        ("tree_at(where, replace=_MISSING)", "private name '_MISSING'"),
        ("filter_vmap(fun, in_axes=DEFAULT_AXES)", "'DEFAULT_AXES' in a default"),
        ("f(x, g=fx._pretty.never)", "private name '_pretty'"),
        ("f(x, g=lambda leaf: _never(leaf))", "private name '_never'"),
        ("f(x, _hidden=1)", "private parameter name '_hidden'"),
        ("f(x, replace=<not given>)", "does not parse as Python"),
        ("Alias = _Target", "private name '_Target'"),
    ],
)
def test_private_or_unknown_defaults_are_reported(signature: str, problem: str) -> None:
    found = check.problems(signature, ALLOWED)
    assert any(problem in line for line in found), found


def test_a_built_site_is_checked_page_by_page(tmp_path: Path) -> None:
    (tmp_path / "api").mkdir()
    (tmp_path / "api" / "index.html").write_text(PAGE)
    (tmp_path / "index.html").write_text("<p>no signatures here</p>")
    count, found = check.check_site(tmp_path, ALLOWED)
    assert count == 2
    assert len(found) == 1 and found[0].startswith("api/index.html: MLP(")
    assert check.main([str(tmp_path)]) == 1


def test_a_site_without_signatures_fails(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text("<p>nothing</p>")
    assert check.main([str(tmp_path)]) == 1


def _meanings() -> dict[str, str]:
    # Read from the extension's source: it imports griffe (the docs extra),
    # which the test extra does not install.
    tree = ast.parse((SCRIPTS / "griffe_public_defaults.py").read_text())
    for node in tree.body:
        if (
            isinstance(node, ast.AnnAssign)
            and getattr(node.target, "id", "") == "MEANINGS"
        ):
            assert node.value is not None
            return ast.literal_eval(node.value)
    raise AssertionError("griffe_public_defaults.py defines no MEANINGS")


@pytest.mark.parametrize("path", sorted(_meanings()))
def test_each_listed_default_exists_and_its_meaning_is_public(path: str) -> None:
    module_name, _, name = path.rpartition(".")
    assert hasattr(importlib.import_module(module_name), name), f"no {path}"
    meaning = _meanings()[path]
    assert check.problems(f"f(x={meaning})", ALLOWED) == []
