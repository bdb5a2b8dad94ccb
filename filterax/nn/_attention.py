"""Scaled dot-product attention: the functions `dot_product_attention_weights`
and `dot_product_attention` (one head), and the `MultiheadAttention` layer."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, PRNGKeyArray

from .._module import Module, field
from .._rng import RngStream
from .._sharding import sublayer_axes
from ._dropout import Dropout
from ._linear import Linear
from ._shared_helpers import deprecated_deterministic, dropout_active, statistics_dtype

__all__ = ["MultiheadAttention"]

_Heads = Float[Array, "seq_length num_heads size"]
_ProcessHeads = Callable[[_Heads, _Heads, _Heads], tuple[_Heads, _Heads, _Heads]]


def _check_matrix(where: str, name: str, x: Array, expected: str) -> None:
    if x.ndim != 2:
        raise ValueError(
            f"{where} expects `{name}` of shape {expected}; got shape {x.shape}."
        )


def dot_product_attention_weights(
    query: Float[Array, "q_seq qk_size"],
    key: Float[Array, "kv_seq qk_size"],
    mask: Bool[Array, "q_seq kv_seq"] | None = None,
) -> Float[Array, "q_seq kv_seq"]:
    """The attention weights `softmax(query @ key.T / sqrt(qk_size))` of one head.

    Masked-out logits are replaced by the most negative finite number of their
    dtype before the softmax, which is computed in at least float32 and cast
    back to the dtype of the logits.

    **Arguments:**

    - `query`: an array of shape `(q_seq, qk_size)`.
    - `key`: an array of shape `(kv_seq, qk_size)`.
    - `mask`: optional, a boolean array of shape `(q_seq, kv_seq)`; `False`
      means the query may not attend to that key.

    **Returns:** an array of shape `(q_seq, kv_seq)` whose rows sum to one.

    **Raises:** `ValueError` on mismatched shapes.

    ```python
    >>> import jax.numpy as jnp, numpy as np
    >>> from filterax.nn._attention import dot_product_attention_weights
    >>> query = jnp.array([[0.0, 2.0]])
    >>> key = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    >>> np.asarray(dot_product_attention_weights(query, key)).round(3)
    array([[0.196, 0.804]], dtype=float32)
    >>> dot_product_attention_weights(query, key, jnp.array([[True, False]]))
    Array([[1., 0.]], dtype=float32)

    ```
    """
    where = "dot_product_attention_weights"
    _check_matrix(where, "query", query, "(q_seq, qk_size)")
    _check_matrix(where, "key", key, "(kv_seq, qk_size)")
    if query.shape[1] != key.shape[1]:
        raise ValueError(
            f"{where}: `query` and `key` must have the same number of channels; "
            f"got shapes {query.shape} and {key.shape}."
        )
    query = query / math.sqrt(query.shape[1])
    logits = jnp.einsum("sd,Sd->sS", query, key)
    if mask is not None:
        if mask.shape != logits.shape:
            raise ValueError(
                f"{where} expects `mask` of shape (q_seq, kv_seq) = {logits.shape}; "
                f"got shape {mask.shape}."
            )
        logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    softmax_dtype = statistics_dtype(logits.dtype)
    return jax.nn.softmax(logits.astype(softmax_dtype)).astype(logits.dtype)


def dot_product_attention(
    query: Float[Array, "q_seq qk_size"],
    key_: Float[Array, "kv_seq qk_size"],
    value: Float[Array, "kv_seq v_size"],
    mask: Bool[Array, "q_seq kv_seq"] | None = None,
    dropout: Dropout | None = None,
    *,
    key: PRNGKeyArray | RngStream | None = None,
    inference: bool | None = None,
) -> Float[Array, "q_seq v_size"]:
    """Scaled dot-product attention of one head:
    `dropout(softmax(query @ key_.T / sqrt(qk_size))) @ value`.

    **Arguments:**

    - `query`: an array of shape `(q_seq, qk_size)`.
    - `key_`: an array of shape `(kv_seq, qk_size)`.
    - `value`: an array of shape `(kv_seq, v_size)`.
    - `mask`: optional, a boolean array of shape `(q_seq, kv_seq)`; `False`
      means the query may not attend to that key.
    - `dropout`: optional, a [`Dropout`][filterax.nn.Dropout] applied to the
      attention weights.
    - `key`: the PRNG key (or [`RngStream`][filterax.RngStream]) for the
      dropout (keyword only).
    - `inference`: passed on to the dropout (keyword only).

    **Returns:** an array of shape `(q_seq, v_size)`.

    **Raises:** `ValueError` on mismatched shapes.

    ```python
    >>> import jax.numpy as jnp, numpy as np
    >>> from filterax.nn._attention import dot_product_attention
    >>> query = jnp.array([[0.0, 2.0]])
    >>> keys = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    >>> values = jnp.array([[10.0], [20.0]])
    >>> np.asarray(dot_product_attention(query, keys, values)).round(2)
    array([[18.04]], dtype=float32)

    ```
    """
    _check_matrix("dot_product_attention", "value", value, "(kv_seq, v_size)")
    if value.shape[0] != key_.shape[0]:
        raise ValueError(
            "dot_product_attention: `key_` and `value` must have the same length; "
            f"got shapes {key_.shape} and {value.shape}."
        )
    weights = dot_product_attention_weights(query, key_, mask)
    if dropout is not None:
        weights = dropout(weights, key=key, inference=inference)
    return jnp.einsum("sS,Sd->sd", weights, value)


# Tensor parallelism over heads (Megatron's split): the projections into heads
# split their output, the projection out of them its input.
_ATTENTION_AXES: dict[str, dict[str, tuple[str | None, ...]]] = {
    "query_proj": {"weight": ("heads", "embed"), "bias": ("heads",)},
    "key_proj": {"weight": ("heads", "embed"), "bias": ("heads",)},
    "value_proj": {"weight": ("heads", "embed"), "bias": ("heads",)},
    "output_proj": {"weight": ("embed", "heads"), "bias": ("embed",)},
}


class MultiheadAttention(Module):
    """Multi-head scaled dot-product attention.

    Each head `i` projects the inputs (`q_i = query @ Wq_i`, `k_i = key_ @ Wk_i`,
    `v_i = value @ Wv_i`, with optional biases), attends with
    `softmax(q_i @ k_i.T / sqrt(qk_size)) @ v_i`, and the heads, concatenated,
    go through the output projection. The four projections are
    [`Linear`][filterax.nn.Linear] layers holding every head at once (so
    `query_proj.weight` has shape `(num_heads * qk_size, query_size)`), and the
    attention weights go through a [`Dropout`][filterax.nn.Dropout].

    **Arguments:**

    - `num_heads`: the number of heads.
    - `query_size`: the number of channels of the query.
    - `key_size`, `value_size`: the number of channels of the key and the
      value; default `query_size`.
    - `output_size`: the number of output channels; default `query_size`.
    - `qk_size`, `vo_size`: the channels per head of the projected query and key,
      and of the projected value; default `query_size // num_heads`.
    - `use_query_bias`, `use_key_bias`, `use_value_bias`, `use_output_bias`:
      whether each projection has a bias.
    - `dropout_p`: the dropout probability on the attention weights.
    - `inference`: whether the dropout starts in inference mode (off); see
      [`inference_mode`][filterax.nn.inference_mode].
    - `dtype`: the dtype of every parameter; defaults to float32 (float64 when
      JAX's x64 mode is on).
    - `key`: the PRNG key for initialisation (keyword only).
    - `axes`: logical axes of the projections' parameters replacing the
      defaults (keyword only), by field name (`"query_proj"`, `"key_proj"`,
      `"value_proj"`, `"output_proj"`), each an `axes=` mapping for
      [`Linear`][filterax.nn.Linear]. The defaults split over heads: the
      query, key and value projections `weight: ("heads", "embed")`, `bias:
      ("heads",)`; the output projection `weight: ("embed", "heads")`, `bias:
      ("embed",)`. See [`sharding_of`][filterax.sharding_of].

    **Returns:** calling the layer on `(query, key_, value)` of shapes
    `(q_seq, query_size)`, `(kv_seq, key_size)`, `(kv_seq, value_size)` returns
    an array of shape `(q_seq, output_size)`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> attention = fx.nn.MultiheadAttention(2, 8, key=jax.random.key(0))
    >>> attention.query_proj.weight.shape
    (8, 8)
    >>> x = jnp.ones((5, 8))
    >>> causal = jnp.tril(jnp.ones((5, 5), bool))
    >>> attention(x, x, x, causal).shape
    (5, 8)

    ```
    """

    query_proj: Linear = field(axes=_ATTENTION_AXES["query_proj"])
    key_proj: Linear = field(axes=_ATTENTION_AXES["key_proj"])
    value_proj: Linear = field(axes=_ATTENTION_AXES["value_proj"])
    output_proj: Linear = field(axes=_ATTENTION_AXES["output_proj"])
    dropout: Dropout

    num_heads: int = field(static=True)
    query_size: int = field(static=True)
    key_size: int = field(static=True)
    value_size: int = field(static=True)
    output_size: int = field(static=True)
    qk_size: int = field(static=True)
    vo_size: int = field(static=True)
    use_query_bias: bool = field(static=True)
    use_key_bias: bool = field(static=True)
    use_value_bias: bool = field(static=True)
    use_output_bias: bool = field(static=True)

    def __init__(
        self,
        num_heads: int,
        query_size: int,
        key_size: int | None = None,
        value_size: int | None = None,
        output_size: int | None = None,
        qk_size: int | None = None,
        vo_size: int | None = None,
        use_query_bias: bool = False,
        use_key_bias: bool = False,
        use_value_bias: bool = False,
        use_output_bias: bool = False,
        dropout_p: float = 0.0,
        inference: bool = False,
        dtype: Any = None,
        *,
        key: PRNGKeyArray,
        axes: dict[str, dict[str, tuple[str | None, ...]]] | None = None,
    ):
        # The default names are declared on the fields above, so that the
        # projections stay ordinary `Linear`s (equal to ones built alone, as
        # `nn.Shared` needs); only names the user gives are kept on them.
        roles = (
            None
            if axes is None
            else sublayer_axes("MultiheadAttention", axes, _ATTENTION_AXES)
        )
        if (
            isinstance(num_heads, bool)
            or not isinstance(num_heads, numbers.Integral)
            or num_heads < 1
        ):
            raise ValueError(
                f"MultiheadAttention needs a positive int num_heads; got {num_heads!r}."
            )
        num_heads = int(num_heads)  # a NumPy integer read from a config file, say
        key_size = query_size if key_size is None else key_size
        value_size = query_size if value_size is None else value_size
        output_size = query_size if output_size is None else output_size
        qk_size = query_size // num_heads if qk_size is None else qk_size
        vo_size = query_size // num_heads if vo_size is None else vo_size
        query_key, key_key, value_key, output_key = jax.random.split(key, 4)
        self.query_proj = Linear(
            query_size,
            num_heads * qk_size,
            use_query_bias,
            dtype,
            key=query_key,
            axes=None if roles is None else roles["query_proj"],
        )
        self.key_proj = Linear(
            key_size,
            num_heads * qk_size,
            use_key_bias,
            dtype,
            key=key_key,
            axes=None if roles is None else roles["key_proj"],
        )
        self.value_proj = Linear(
            value_size,
            num_heads * vo_size,
            use_value_bias,
            dtype,
            key=value_key,
            axes=None if roles is None else roles["value_proj"],
        )
        self.output_proj = Linear(
            num_heads * vo_size,
            output_size,
            use_output_bias,
            dtype,
            key=output_key,
            axes=None if roles is None else roles["output_proj"],
        )
        self.dropout = Dropout(dropout_p, inference=inference)
        self.num_heads = num_heads
        self.query_size = query_size
        self.key_size = key_size
        self.value_size = value_size
        self.output_size = output_size
        self.qk_size = qk_size
        self.vo_size = vo_size
        self.use_query_bias = use_query_bias
        self.use_key_bias = use_key_bias
        self.use_value_bias = use_value_bias
        self.use_output_bias = use_output_bias

    def __call__(
        self,
        query: Float[Array, "q_seq query_size"],
        key_: Float[Array, "kv_seq key_size"],
        value: Float[Array, "kv_seq value_size"],
        mask: Bool[Array, "q_seq kv_seq"]
        | Bool[Array, "num_heads q_seq kv_seq"]
        | None = None,
        *,
        key: PRNGKeyArray | RngStream | None = None,
        inference: bool | None = None,
        deterministic: bool | None = None,
        process_heads: _ProcessHeads | None = None,
    ) -> Float[Array, "q_seq output_size"]:
        """Attends from `query` to `key_`/`value`.

        **Arguments:**

        - `query`: an array of shape `(q_seq, query_size)`.
        - `key_`: an array of shape `(kv_seq, key_size)`.
        - `value`: an array of shape `(kv_seq, value_size)`.
        - `mask`: optional, a boolean array of shape `(q_seq, kv_seq)` shared by
          every head, or `(num_heads, q_seq, kv_seq)` for one mask per head;
          `False` means the query may not attend to that key.
        - `key`: for the dropout (keyword only): a PRNG key, split into one key
          per head; or an [`RngStream`][filterax.RngStream], from which one key
          is drawn (only when the dropout is active) and split likewise.
        - `inference`: overrides the dropout's `inference` flag (keyword only).
        - `deterministic`: deprecated spelling of `inference`; warns with a
          `FilteraxDeprecationWarning` (keyword only).
        - `process_heads`: optional, a function taking and returning the
          projected `(query_heads, key_heads, value_heads)`, of shapes
          `(q_seq, num_heads, qk_size)`, `(kv_seq, num_heads, qk_size)` and
          `(kv_seq, num_heads, vo_size)`, applied before the attention (for
          example rotary embeddings); it must not change the shapes (keyword
          only).

        **Returns:** an array of shape `(q_seq, output_size)`.

        **Raises:** `ValueError` on inputs or a mask of the wrong shape, or when
        `process_heads` changes a shape.
        """
        if deterministic is not None:
            deprecated_deterministic("MultiheadAttention()")
            inference = deterministic
        self._check_inputs(query, key_, value, mask)
        query_heads = self._project(self.query_proj, query)
        key_heads = self._project(self.key_proj, key_)
        value_heads = self._project(self.value_proj, value)
        if process_heads is not None:
            shapes = (query_heads.shape, key_heads.shape, value_heads.shape)
            query_heads, key_heads, value_heads = process_heads(
                query_heads, key_heads, value_heads
            )
            new_shapes = (query_heads.shape, key_heads.shape, value_heads.shape)
            if new_shapes != shapes:
                raise ValueError(
                    "process_heads must return query, key and value heads of the "
                    f"shapes it was given, {shapes}; it returned {new_shapes}."
                )
        if isinstance(key, RngStream):
            key = key() if dropout_active(self.dropout, inference) else None
        head_keys = None if key is None else jax.random.split(key, self.num_heads)

        def attend(query_head, key_head, value_head, head_mask, head_key):
            return dot_product_attention(
                query_head,
                key_head,
                value_head,
                head_mask,
                self.dropout,
                key=head_key,
                inference=inference,
            )

        mask_axis = 0 if mask is not None and mask.ndim == 3 else None
        attended = jax.vmap(attend, in_axes=(1, 1, 1, mask_axis, 0), out_axes=1)(
            query_heads, key_heads, value_heads, mask, head_keys
        )
        return jax.vmap(self.output_proj)(attended.reshape(query.shape[0], -1))

    def _project(self, projection: Linear, x: Array) -> Array:
        """`(seq, size)` to `(seq, num_heads, channels per head)`."""
        return jax.vmap(projection)(x).reshape(x.shape[0], self.num_heads, -1)

    def _check_inputs(
        self, query: Array, key_: Array, value: Array, mask: Array | None
    ) -> None:
        for name, x, size in (
            ("query", query, self.query_size),
            ("key_", key_, self.key_size),
            ("value", value, self.value_size),
        ):
            if x.ndim != 2 or x.shape[1] != size:
                raise ValueError(
                    f"MultiheadAttention expects `{name}` of shape (seq_length, "
                    f"{size}); got shape {x.shape}. Use `jax.vmap` over a batch."
                )
        if key_.shape[0] != value.shape[0]:
            raise ValueError(
                "MultiheadAttention: `key_` and `value` must have the same length; "
                f"got shapes {key_.shape} and {value.shape}."
            )
        if mask is not None:
            shared = (query.shape[0], key_.shape[0])
            if mask.shape not in (shared, (self.num_heads, *shared)):
                raise ValueError(
                    f"MultiheadAttention expects `mask` of shape {shared} or "
                    f"{(self.num_heads, *shared)}; got shape {mask.shape}."
                )
