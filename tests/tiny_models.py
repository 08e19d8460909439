"""Tiny Llama-style model pairs and a character tokenizer, built offline for the decoding tests.

Weights use a large initializer range so next-token distributions are far from uniform; the
draft is the target with noise added to every weight, so acceptance is neither 0 nor 1.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from spec_samplers.certify.tiny_models import CHARS, char_tokenizer  # noqa: F401  (CHARS: benchmarks use it)


def tiny_llama(seed: int, vocab_size: int = 16, hidden: int = 16, layers: int = 2, eos_token_id: int | None = None):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.3,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        pad_token_id=None,
    )
    return LlamaForCausalLM(config).eval()


def noisy_copy(model, scale: float, seed: int):
    """The model with N(0, (scale * std of each weight)^2) noise added: a draft that agrees in part."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * (p.std() if p.numel() > 1 else 1.0))
    return draft.eval()


def save_pair(directory, draft_noise: float = 0.5) -> tuple[str, str]:
    """Save a tiny target/draft pair with the character tokenizer (vocabulary 25, EOS id 1) under
    ``directory`` (a path or a str); returns the two model directories. Users get a pair with
    ``spec-samplers tiny-pair DIR``."""
    target = tiny_llama(0, vocab_size=len(CHARS) + 2, hidden=32, eos_token_id=1)
    draft = noisy_copy(target, draft_noise, seed=1)
    paths = []
    for name, model in (("target", target), ("draft", draft)):
        path = Path(directory) / name
        model.save_pretrained(path)
        char_tokenizer().save_pretrained(path)
        paths.append(str(path))
    return paths[0], paths[1]


def greedy_text(model_dir: str, prompt: str, max_new_tokens: int) -> str:
    """The target's own greedy continuation of ``prompt`` (transformers' ``generate``), decoded: what
    ``spec-samplers generate --temperature 0`` must print, chain or tree."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    ids = torch.tensor([tokenizer(prompt)["input_ids"]])
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(ref[0], skip_special_tokens=True)
