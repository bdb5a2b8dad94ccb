"""Pretrained weights by key path: safetensors files read onto any pytree and
written from one (the optional extra `pip install "filterax[safetensors]"`).

`save(path, tree)` writes every array leaf under its key path joined with
dots (`layers.0.weight`); `load(path, like, rename=..., strict=...)` reads
the tensors of a file (or of a multi-file checkpoint, by its index) into a
pytree like `like`, renaming the file's names with regex rules first, and
places each array on its leaf's sharding, reading only the slices this
process's devices hold.

- `_names.py`: the array leaves of a pytree and their tensor names.
- `_files.py`: the files a path names, their headers read and checked, and
  atomic writes.
- `_read.py`: one tensor into a leaf like `like`'s, shard by shard.
- `_save.py`: `save`.
- `_load.py`: `load`: renaming, matching names, checking shapes, reading.

May import: `jax`, `numpy`, the safetensors package, and the filterax
layers below the public surface (`_tree._filters`, `_serialisation`, `_warnings`).
Nothing in filterax imports this package: `import filterax` never imports
safetensors.
"""

try:
    import safetensors as _safetensors  # noqa: F401
except ModuleNotFoundError as _error:
    if not (_error.name or "").startswith("safetensors"):
        raise
    raise ModuleNotFoundError(
        "filterax.safetensors needs the safetensors package, which is not "
        'installed: pip install "filterax[safetensors]"',
        name=_error.name,
    ) from _error

from ._load import load as load
from ._save import save as save

__all__ = ["load", "save"]
