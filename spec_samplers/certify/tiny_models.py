"""A tiny random Llama target and a 1-layer draft, written with ``save_pretrained``: the model pair
``spec-samplers certify`` builds when no ``--target`` is given, and the engine tier's models.

The target has a small vocabulary (so its exact law of a few tokens has few cells) and a large
initializer range (so its next-token laws are far from uniform). The draft is the target's
embedding, first decoder layer, final norm and head, with noise added to every weight: it shares
the vocabulary and agrees with the target in part, so acceptance is neither 0 nor 1. Head size 32
is one the vLLM CPU attention backend supports. :func:`build_tiny_pair` saves no tokenizer: engines
are given token-id prompts (vLLM with ``skip_tokenizer_init=True``). :func:`tiny_pair_with_tokenizer`
(``spec-samplers tiny-pair DIR``) saves a character tokenizer next to both models, so that text
prompts work too (``generate``, the transformers examples).

Example::

    >>> from spec_samplers.certify.tiny_models import build_tiny_pair, load_causal_lm
    >>> pair = build_tiny_pair("/tmp/tiny")              # writes /tmp/tiny/target and /tmp/tiny/draft
    >>> target = load_causal_lm(pair.target)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from spec_samplers.constants import input_error

#: prompts (token ids) certify uses on the tiny pair; every id is below the smallest vocabulary allowed
TINY_PROMPTS: tuple[tuple[int, ...], ...] = ((1, 2, 3), (4, 5), (6, 7, 8, 9))
MIN_VOCAB = 10
#: the character tokenizer's characters, ids 2.. (0 = <unk>, 1 = <eos>): one id per character
CHARS = "abcdefghijklmnopqrstuv "


@dataclass(frozen=True)
class TinyPair:
    """Directories of a saved target/draft pair and how they were built."""

    target: str
    draft: str
    vocab_size: int
    seed: int


#: the saved dtype (transformers' config field, typed per version: passed by name)
_FP32: dict[str, Any] = {"torch_dtype": "float32"}


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """transformers' progress bars off (a tiny model saves and loads at once; the bars would only
    crowd a command's one-line answer on stderr), restored after."""
    from transformers.utils import logging

    was = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            logging.enable_progress_bar()


def tiny_llama_config(
    vocab_size: int = 16,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    initializer_range: float = 0.3,
    max_position_embeddings: int = 512,
    eos_token_id: int | None = None,
) -> Any:
    """A ``LlamaConfig`` for a tiny model (head size hidden_size / num_heads), saved in fp32."""
    from transformers import LlamaConfig

    if not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB:
        raise input_error("vocab_size", f"an int >= {MIN_VOCAB}", repr(vocab_size))
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range,
        tie_word_embeddings=False,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        pad_token_id=None,
        **_FP32,
    )


def tiny_llama(seed: int = 0, **config: Any) -> torch.nn.Module:
    """A random LlamaForCausalLM (fp32, eval mode) from :func:`tiny_llama_config` ``(**config)``."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_llama_config(**config)).eval()


def draft_of(target: Any, num_layers: int = 1, noise: float = 0.5, seed: int = 1) -> Any:
    """A draft with the target's first ``num_layers`` decoder layers, embedding, norm and head, each
    weight plus N(0, (noise * its std)^2) noise."""
    from transformers import LlamaForCausalLM

    config = target.config.__class__(**target.config.to_dict())
    config.num_hidden_layers = num_layers
    draft = LlamaForCausalLM(config).eval()
    own = draft.state_dict()
    draft.load_state_dict({k: v for k, v in target.state_dict().items() if k in own})
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * noise * (p.std() if p.numel() > 1 else 1.0))
    return draft


def build_tiny_pair(
    directory: str | os.PathLike[str],
    vocab_size: int = 16,
    target_layers: int = 2,
    draft_noise: float = 0.1,
    seed: int = 0,
    eos_token_id: int | None = None,
) -> TinyPair:
    """Save a tiny target (``target_layers`` layers) and its 1-layer draft under ``directory``
    (``target/`` and ``draft/``); returns their paths. Deterministic in ``seed``."""
    root = Path(directory)
    target = tiny_llama(seed, vocab_size=vocab_size, num_layers=target_layers, eos_token_id=eos_token_id)
    draft = draft_of(target, num_layers=1, noise=draft_noise, seed=seed + 1)
    paths = []
    models: tuple[tuple[str, Any], ...] = (("target", target), ("draft", draft))
    for name, model in models:
        path = root / name
        with _no_progress_bars():
            model.save_pretrained(path)
        paths.append(str(path))
    return TinyPair(paths[0], paths[1], vocab_size, seed)


def char_tokenizer() -> Any:
    """A character tokenizer over :data:`CHARS` (a transformers ``PreTrainedTokenizerFast``):
    vocabulary len(CHARS) + 2, ``<unk>`` 0 for any other character, ``<eos>`` 1."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(CHARS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")


def tiny_pair_with_tokenizer(directory: str | os.PathLike[str], seed: int = 0) -> TinyPair:
    """``spec-samplers tiny-pair DIR``: :func:`build_tiny_pair` over the character tokenizer's
    vocabulary (25 ids, EOS 1), the tokenizer saved next to both models, so that the pair loads
    with ``AutoTokenizer`` / ``AutoModelForCausalLM`` and takes text prompts."""
    pair = build_tiny_pair(directory, vocab_size=len(CHARS) + 2, seed=seed, eos_token_id=1)
    for path in (pair.target, pair.draft):
        char_tokenizer().save_pretrained(path)
    return pair


def load_causal_lm(path: str | os.PathLike[str], dtype: torch.dtype = torch.float32) -> Any:
    """A saved causal LM from a local directory (no download), in eval mode."""
    from transformers import AutoModelForCausalLM

    with _no_progress_bars():
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True).eval()
