"""`filterax.nn`: the neural-network layers of `equinox.nn`, as plain Modules.

Layers are written as a user's own layers would be, with the core's public names
only (`Module`, `field`, `filter_vmap`, `RngStream`...). They import those names
from the packages that define them (`.._module`, `.._mapping`...), not from the
root package, which imports this one: the import graph has no circle. Nothing
outside `filterax/__init__.py` imports this package.

May import: the core's public names from `_module`, `_tree._filters`, `_tree`,
`_pretty`, `_mapping`, `_eval_shape`, `_rng`, `_missing`, `_ad`'s
`unfrozen` (a frozen parameter as the array `lax` needs) and
`filter_checkpoint`, `_control`'s `filter_scan` and `_tree._structure`'s error
texts (for `Stacked`), and `_compat`'s
`same_structure` (treedefs compared with their node classes), `_warnings`
(deprecations, warnings attributed to the caller), `_sharding`'s helpers
for the layers' default logical axes and `axes=` overrides, `_precision`'s
registry of buffers never cast, `_treescope`
(the display hooks); `jax`, `jaxtyping`.
Helpers shared by several layers live in `_shared_helpers.py`; layers import
those from there, and each other only for public classes.
"""

from typing import NoReturn as _NoReturn

from .._missing import missing_name_error as _missing_name_error
from ._activations import PReLU as PReLU
from ._attention import MultiheadAttention as MultiheadAttention
from ._batch_norm import BatchNorm as BatchNorm
from ._conv import (
    Conv as Conv,
    Conv1d as Conv1d,
    Conv2d as Conv2d,
    Conv3d as Conv3d,
    ConvTranspose as ConvTranspose,
    ConvTranspose1d as ConvTranspose1d,
    ConvTranspose2d as ConvTranspose2d,
    ConvTranspose3d as ConvTranspose3d,
)
from ._dropout import Dropout as Dropout
from ._embedding import Embedding as Embedding
from ._inference import inference_mode as inference_mode
from ._linear import (
    Identity as Identity,
    Linear as Linear,
)
from ._mlp import MLP as MLP
from ._normalisation import (
    GroupNorm as GroupNorm,
    LayerNorm as LayerNorm,
    RMSNorm as RMSNorm,
)
from ._pool import (
    AdaptiveAvgPool1d as AdaptiveAvgPool1d,
    AdaptiveAvgPool2d as AdaptiveAvgPool2d,
    AdaptiveAvgPool3d as AdaptiveAvgPool3d,
    AdaptiveMaxPool1d as AdaptiveMaxPool1d,
    AdaptiveMaxPool2d as AdaptiveMaxPool2d,
    AdaptiveMaxPool3d as AdaptiveMaxPool3d,
    AdaptivePool as AdaptivePool,
    AvgPool1d as AvgPool1d,
    AvgPool2d as AvgPool2d,
    AvgPool3d as AvgPool3d,
    MaxPool1d as MaxPool1d,
    MaxPool2d as MaxPool2d,
    MaxPool3d as MaxPool3d,
    Pool as Pool,
)
from ._rnn import (
    GRUCell as GRUCell,
    LSTMCell as LSTMCell,
)
from ._rope import RotaryPositionalEmbedding as RotaryPositionalEmbedding
from ._sequential import (
    Lambda as Lambda,
    Sequential as Sequential,
    StatefulLayer as StatefulLayer,
)
from ._shared import Shared as Shared
from ._spectral_norm import SpectralNorm as SpectralNorm
from ._stacked import Stacked as Stacked
from ._stateful import (
    State as State,
    StateIndex as StateIndex,
    delete_init_state as delete_init_state,
    make_with_state as make_with_state,
)
from ._weight_norm import WeightNorm as WeightNorm

__all__ = [
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
    "AdaptivePool",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "BatchNorm",
    "Conv",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "Dropout",
    "Embedding",
    "GRUCell",
    "GroupNorm",
    "Identity",
    "LSTMCell",
    "Lambda",
    "LayerNorm",
    "Linear",
    "MLP",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "MultiheadAttention",
    "PReLU",
    "Pool",
    "RMSNorm",
    "RotaryPositionalEmbedding",
    "Sequential",
    "Shared",
    "SpectralNorm",
    "Stacked",
    "State",
    "StateIndex",
    "StatefulLayer",
    "WeightNorm",
    "delete_init_state",
    "inference_mode",
    "make_with_state",
]


def __getattr__(name: str) -> _NoReturn:
    # Only called for names not found: Equinox's get an explanation.
    _missing_name_error("filterax.nn", name)
