"""transformers causal LMs as :class:`spec_samplers.decoding.LanguageModel` s.

``HFLanguageModel(model)`` runs a ``transformers`` causal LM (Llama, Qwen2, ... any model that
takes ``position_ids`` and a 2-d ``attention_mask``) on its own ``DynamicCache``, wrapped in
:class:`HFKVCache`, which crops per request. transformers is imported when this module's classes
are used, never by ``import spec_samplers``; it comes with ``pip install -e ".[transformers]"`` (from a checkout).

Example::

    >>> from transformers import AutoModelForCausalLM
    >>> from spec_samplers.decoding import SpeculativeDecoder
    >>> target = HFLanguageModel(AutoModelForCausalLM.from_pretrained("/models/target"))
    >>> draft = HFLanguageModel.from_pretrained("/models/draft")      # local directory
    >>> out = SpeculativeDecoder(target, draft, num_speculative_tokens=4).generate(prompt_ids, 64)
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
from collections.abc import Sequence
from importlib import metadata
from types import ModuleType
from typing import Any

import torch

from spec_samplers.constants import input_error
from spec_samplers.decoding.interfaces import KVCache, KVState
from spec_samplers.decoding.kv_cache import SlotKVCache, _gather_slots
from spec_samplers.integrations.hf_generate import SpeculativeGenerate

__all__ = [
    "HFKVCache",
    "HFLanguageModel",
    "SpeculativeGenerate",
    "load_model_pair",
    "speculative_generate",
    "tree_attention_inputs",
]

#: oldest transformers whose DynamicCache has per-layer ``keys``/``values`` and ``crop(-n)``
MIN_TRANSFORMERS = (4, 56)
INSTALL_HINT = "pip install -e '.[transformers]' in a checkout of spec-samplers"


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def require_transformers() -> ModuleType:
    """Import transformers, or raise ImportError naming the package, the version needed and the
    installed one."""
    needed = ".".join(map(str, MIN_TRANSFORMERS))
    try:
        module = importlib.import_module("transformers")
    except ImportError as exc:
        raise ImportError(
            f"spec_samplers.integrations.transformers needs the transformers package (>= {needed}), "
            f"which is not installed: {INSTALL_HINT}"
        ) from exc
    installed = _installed_version(getattr(module, "__version__", "0"))
    if _version_tuple(installed) < MIN_TRANSFORMERS:
        raise ImportError(
            f"spec_samplers.integrations.transformers needs transformers >= {needed}, found {installed}: {INSTALL_HINT}"
        )
    return module


@functools.cache
def _installed_version(fallback: str) -> str:
    """transformers' installed version (its metadata, else ``fallback``): looked up once, since
    reading package metadata takes about 2 ms and every ``generate`` call checks it."""
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return fallback


class HFKVCache(SlotKVCache):
    """The seed's KVCache over a transformers ``DynamicCache`` (``self.cache``), with per-request
    crops (see ``spec_samplers.decoding.kv_cache``)."""

    def __init__(self, cache: Any = None) -> None:
        super().__init__()
        self.cache = cache if cache is not None else require_transformers().DynamicCache()

    def _layers(self) -> list[Any]:
        layers = getattr(self.cache, "layers", None)
        if layers is None:
            raise RuntimeError(f"{type(self.cache).__name__} has no per-layer storage (transformers >= 4.56 needed)")
        return [layer for layer in layers if getattr(layer, "keys", None) is not None and layer.keys.numel()]

    def _num_slots(self) -> int:
        return int(self.cache.get_seq_length())

    def _storage_append(self, kv_states: Sequence[KVState]) -> None:
        for i, (keys, values) in enumerate(kv_states):
            self.cache.update(keys, values, i)

    def _storage_trim(self, num_slots: int) -> None:
        self.cache.crop(-num_slots)  # negative: remove that many (transformers >= 4.5x)

    def _storage_gather(self, index: torch.Tensor) -> None:
        for layer in self._layers():
            layer.keys = _gather_slots(layer.keys, index)
            layer.values = _gather_slots(layer.values, index)

    def _storage_select(self, indices: torch.Tensor) -> None:
        self.cache.batch_select_indices(indices)

    def _storage_states(self) -> list[KVState]:
        return [KVState(layer.keys, layer.values) for layer in self._layers()]


def _unsupported_layers(config: Any) -> list[str]:
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        return sorted({t for t in layer_types if t != "full_attention"})
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return ["sliding_attention"]
    return []


def cache_argument(model: Any) -> str:
    """The name under which ``model.forward`` takes its KV cache: ``cache`` from transformers 5.24
    on (``past_key_values`` still works there, with a deprecation warning, until 5.40), else
    ``past_key_values``."""
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # a forward without a readable signature: the long-standing name
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


def _takes_logits_to_keep(model: Any) -> bool:
    """Whether ``model.forward`` computes the LM head on the last positions only when asked
    (``logits_to_keep``, transformers' causal LMs since 4.50)."""
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


#: causal LMs whose forward is ``lm_head(self.model(...).last_hidden_state)`` and nothing more (no
#: logit scale or soft-capping; read in transformers 4.56 and 5.20)
_PLAIN_HEAD_MODELS = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"})
#: (widest hidden size, most rows) of the CPU fp32 head products taken by the compiled kernel
#: (``spec_samplers.cpu.head_rows``: the head read once per 8 rows at about the machine's read
#: bandwidth) when numba is ready. Its time against the faster of F.linear and the streamed form,
#: one thread (benchmarks/head_product.py; docs/cpu.md "generate"): 1.24-2.24x faster at 1-8 rows
#: over [32000, 512 ... 4096] and [151936, 896] heads, 1.2-1.67x at 16 rows and H <= 896, 0.84-0.91x
#: at 16 rows and H >= 1024 (F.linear's blocked product wins there).
HEAD_KERNEL_ROWS = ((896, 16), (2**62, 8))
#: (widest hidden size, most rows) of the CPU fp32 head products taken as ``weight @ rows.T``
#: (rows padded to two when there is one) instead of ``F.linear`` where the kernel is not ready. On
#: the project's CPU (MKL, one thread) ``F.linear`` reads a [V, H] head about once per row for 2-5
#: rows, and its one-row product (a matrix-vector kernel) reads slower than the two-row matrix
#: product: at V = 32000 the streamed form took 1/1.64 (1 row), 1/3.1 (2) and 1/2.2 (4) of
#: F.linear's time at H = 512, 1/1.1-1/2.4 at H = 1024, 1/1.1 at 8 rows and H <= 768; at 8 rows and
#: H >= 1024, and at H = 4096, F.linear was faster, so it keeps those.
HEAD_STREAM_ROWS = ((768, 8), (1024, 4))


def _within(table: tuple[tuple[int, int], ...], rows: int, width: int) -> bool:
    return any(width <= widest and rows <= most for widest, most in table)


def _plain_head(model: Any) -> tuple[Any, str, Any] | None:
    """(the decoder, the name it takes its cache under, the LM head) of a listed causal LM whose
    head is a linear map without bias, else None: :meth:`HFLanguageModel.forward` then takes the
    head product itself (:func:`head_logits`)."""
    head, decoder = getattr(model, "lm_head", None), getattr(model, "model", None)
    if type(model).__name__ not in _PLAIN_HEAD_MODELS or type(head) is not torch.nn.Linear or decoder is None:
        return None
    return (decoder, cache_argument(decoder), head) if head.bias is None else None


def head_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear(hidden, weight)``, logits [B, Q, V] of hidden states [B, Q, H] and a head [V, H].
    CPU fp32 products of few rows read the head once: by the compiled kernel for the shapes of
    :data:`HEAD_KERNEL_ROWS` (``spec_samplers.cpu.head_rows``, numba), else as ``weight @ rows.T``
    (one row padded to two) for those of :data:`HEAD_STREAM_ROWS`; the same products, summed in
    another order: equal to a few fp32 ulps."""
    B, Q, H = hidden.shape
    rows = B * Q
    if hidden.device.type != "cpu" or hidden.dtype != torch.float32 or weight.dtype != torch.float32 or rows == 0:
        return torch.nn.functional.linear(hidden, weight)
    x = hidden.reshape(rows, H)
    if _within(HEAD_KERNEL_ROWS, rows, H) and weight.is_contiguous():
        from spec_samplers.cpu import head_rows

        out = head_rows(weight, x)  # (None while numba's code is not ready, or without numba)
        if out is not None:
            return out.view(B, Q, -1)
    if not _within(HEAD_STREAM_ROWS, rows, H):
        return torch.nn.functional.linear(hidden, weight)
    if rows == 1:
        x = torch.cat([x, x.new_zeros(1, H)])
    return (weight @ x.T).T[:rows].reshape(B, Q, -1).contiguous()


class _Unset:
    pass


_UNSET = _Unset()


class HFLanguageModel:
    """A transformers causal LM as the seed's :class:`LanguageModel`.

    Args:
        model: a ``PreTrainedModel`` with a causal LM head (e.g. ``AutoModelForCausalLM``); every
            layer must use full attention (sliding-window and linear-attention layers count
            window positions in cache slots, which per-request crops leave holes in).
        eos_token_id: overrides the stop token(s); by default the generation config's
            ``eos_token_id``, else the model config's. None: no EOS.

    ``forward`` runs under ``torch.no_grad`` and returns the model's logits [B, Q, V].
    """

    def __init__(self, model: Any, eos_token_id: int | Sequence[int] | None | _Unset = _UNSET) -> None:
        require_transformers()
        config = model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        unsupported = _unsupported_layers(text_config)
        if unsupported:
            raise ValueError(
                f"HFLanguageModel: {type(model).__name__} has {', '.join(unsupported)} layers; only full-attention "
                "models are supported (per-request KV-cache crops leave holes that window masks would count)"
            )
        self.model = model
        self._cache_argument = cache_argument(model)
        self._keeps_logits = _takes_logits_to_keep(model)
        self._head = _plain_head(model)
        self._vocab_size = int(getattr(text_config, "vocab_size", 0)) or None
        if isinstance(eos_token_id, _Unset):
            generation = getattr(model, "generation_config", None)
            eos_token_id = getattr(generation, "eos_token_id", None)
            if eos_token_id is None:
                eos_token_id = getattr(text_config, "eos_token_id", None)
        ids = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise input_error("eos_token_id", "None, an int or a sequence of ints", repr(eos_token_id))
        self._eos = tuple(ids)

    @classmethod
    def from_pretrained(
        cls, path: str, device: str | torch.device | None = None, dtype: torch.dtype | str | None = None, **kwargs: Any
    ) -> HFLanguageModel:
        """Load a local model directory (no download: ``local_files_only=True``)."""
        transformers = require_transformers()
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, dtype=dtype if dtype is not None else "auto", **kwargs
        )
        if device is not None:
            model = model.to(device)
        return cls(model.eval())

    @property
    def eos_token_id(self) -> int:
        """The first EOS id of the configuration; ValueError when it has none."""
        if not self._eos:
            raise ValueError(f"{type(self.model).__name__}: the model configuration has no eos_token_id")
        return self._eos[0]

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every EOS id of the configuration (Llama 3 lists several); () when none."""
        return self._eos

    @property
    def vocab_size(self) -> int | None:
        return self._vocab_size

    @property
    def device(self) -> torch.device:
        return self.model.device

    def new_kv_cache(self) -> HFKVCache:
        return HFKVCache()

    @torch.no_grad()
    def forward(self, query_token_ids: torch.Tensor, kv_cache: KVCache) -> torch.Tensor:
        """logits [B, Q, V] for ``query_token_ids`` [B, Q] (-1 = padding) after ``kv_cache``'s
        tokens; the cache receives the query's keys and values."""
        return self._forward(query_token_ids, kv_cache, last=False)

    @torch.no_grad()
    def forward_last(self, query_token_ids: torch.Tensor, kv_cache: KVCache) -> torch.Tensor:
        """(extension) logits [B, V] of the query's last position only, as ``forward(...)[:, -1]``;
        the cache receives every query slot. The LM head runs on that position alone (taken by
        the wrapper for the listed models, else where the model takes ``logits_to_keep``,
        transformers' causal LMs): the head over a 32000-wide or larger vocabulary costs a prefill
        or a draft step about as much as its layers."""
        return self._forward(query_token_ids, kv_cache, last=True)[:, -1]

    def _forward(self, query_token_ids: torch.Tensor, kv_cache: KVCache, last: bool) -> torch.Tensor:
        if not isinstance(kv_cache, HFKVCache):
            raise input_error("kv_cache", "an HFKVCache (HFLanguageModel.new_kv_cache())", type(kv_cache).__name__)
        layout = kv_cache.query_layout(query_token_ids.to(self.device))
        inputs = {
            "input_ids": layout.input_ids,
            "attention_mask": layout.attention_mask,
            "position_ids": layout.position_ids,
            "use_cache": True,
        }
        if self._head is not None:  # the head product is ours
            decoder, cache_name, head = self._head
            hidden = decoder(**inputs, **{cache_name: kv_cache.cache}).last_hidden_state
            logits = head_logits(hidden[:, -1:] if last else hidden, head.weight)
        else:
            extra = {"logits_to_keep": 1} if last and self._keeps_logits else {}
            logits = self.model(**inputs, **{self._cache_argument: kv_cache.cache}, **extra).logits
        kv_cache.append_query_slots(layout)
        return logits

    @torch.no_grad()
    def forward_tree(
        self,
        query_token_ids: torch.Tensor,  # [B, Q] int64, -1 = padding node
        query_parents: torch.Tensor,  # [Q] or [B, Q] int64: parent in [0, i), -1 = attached to the cache
        kv_cache: KVCache,
    ) -> torch.Tensor:
        """Tree attention: logits [B, Q, V] of a token tree scored in one pass (query token i sees
        the cache, its ancestors and itself; position = cache tokens + depth). The cache receives
        every query slot; keep only an accepted path with ``kv_cache.keep_query_slots(keep)``."""
        if not isinstance(kv_cache, HFKVCache):
            raise input_error("kv_cache", "an HFKVCache (HFLanguageModel.new_kv_cache())", type(kv_cache).__name__)
        query = query_token_ids.to(self.device)
        parents = query_parents.to(self.device, torch.int64)
        if parents.dim() == 1:
            parents = parents[None].expand(query.shape[0], -1)
        layout = kv_cache.query_layout(query)
        L = layout.attention_mask.shape[1] - query.shape[1]
        mask, positions = tree_attention_inputs(
            layout.attention_mask[:, :L].bool(), layout.valid, parents, self.model.dtype
        )
        out = self.model(
            input_ids=layout.input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{self._cache_argument: kv_cache.cache},
        )
        kv_cache.append_query_slots(layout)
        return out.logits


def tree_attention_inputs(
    cache_valid: torch.Tensor,  # [B, L] bool: the cache slots holding tokens
    query_valid: torch.Tensor,  # [B, Q] bool: False on padding nodes
    query_parents: torch.Tensor,  # [B, Q] int64: parent of query token i in [0, i), -1: the cache's last token
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(4D additive attention mask [B, 1, Q, L+Q] of ``dtype``, position ids [B, Q]) of a token
    tree: query token i sees the cache's tokens, its ancestors in the query and itself; its
    position is the cache's token count plus its depth in the query (root-level tokens: depth 0).
    A padding node sees itself only (its slot is never attended afterwards)."""
    B, Q = query_parents.shape
    device = query_parents.device
    eye = torch.eye(Q, dtype=torch.bool, device=device)[None].expand(B, Q, Q)
    sees = eye.clone()  # [B, Q, Q] ancestor-or-self, built parents-first
    depth = torch.zeros(B, Q, dtype=torch.int64, device=device)
    for i in range(Q):
        par = query_parents[:, i]
        has = (par >= 0) & (par < i)
        row = sees.gather(1, par.clamp(min=0)[:, None, None].expand(B, 1, Q)).squeeze(1)  # parent's row
        sees[:, i] = torch.where(has[:, None], row | eye[:, i], eye[:, i])
        depth[:, i] = torch.where(has, depth.gather(1, par.clamp(min=0)[:, None]).squeeze(1) + 1, 0)
    sees = sees & (query_valid[:, None, :] | eye)
    allowed = torch.cat([cache_valid[:, None, :].expand(B, Q, cache_valid.shape[1]), sees], dim=2)
    allowed = allowed & (
        query_valid[:, :, None] | torch.cat([torch.zeros_like(allowed[..., : cache_valid.shape[1]]), eye], 2)
    )
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
    positions = cache_valid.sum(dim=1, keepdim=True) + depth
    return mask[:, None], positions


def load_tokenizer(path: str) -> Any:
    """The tokenizer of a local model directory (no download)."""
    return require_transformers().AutoTokenizer.from_pretrained(path, local_files_only=True)


def check_model_dir(path: str, argument: str) -> None:
    """ValueError naming ``argument`` and ``path`` unless ``path`` is an existing directory.

    Checked before transformers is imported: it would otherwise read a missing path as a Hub
    repository id and fail late with an error about repository names."""
    if not os.path.isdir(path):
        what = "is not a directory" if os.path.exists(path) else "does not exist"
        raise ValueError(f"{argument}: {path} {what} (expected a local model directory in transformers format)")


def load_model_pair(
    target: str, draft: str, device: torch.device, dtype: torch.dtype | None = None, stop_at_eos: bool = True
) -> tuple[HFLanguageModel, HFLanguageModel, Any]:
    """(target, draft, tokenizer) from two local model directories: both models as
    :class:`HFLanguageModel` on ``device`` in ``dtype`` (None: the checkpoint's dtype, float32 on
    CPU), and the target's tokenizer. ``stop_at_eos=False`` drops the EOS ids so that every
    generation runs to its token budget (what a benchmark wants). Used by ``spec-samplers
    generate`` and ``spec-samplers bench models``."""
    check_model_dir(target, "target")
    check_model_dir(draft, "draft")
    if dtype is None and device.type == "cpu":
        dtype = torch.float32  # CPU matmuls in bf16/fp16 are slow and some are missing
    models = []
    for path in (target, draft):
        model = HFLanguageModel.from_pretrained(path, device=device, dtype=dtype)
        if not stop_at_eos:
            model = HFLanguageModel(model.model, eos_token_id=None)
        models.append(model)
    return models[0], models[1], load_tokenizer(target)


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of ``prompt``; ValueError when the tokenizer gives none."""
    ids = list(tokenizer(prompt)["input_ids"])
    if not ids:
        raise ValueError(f"--prompt {prompt!r}: the tokenizer gives no tokens")
    return ids


#: the ``generate(custom_generate=...)`` callable (spec_samplers.integrations.hf_generate)
speculative_generate = SpeculativeGenerate(HFLanguageModel, require_transformers)
