"""Counter-based random numbers shared bit for bit by the PyTorch path and the Triton kernels.

Every random number is a pure function of (seed, offset, position, vocab index, stream)
(docs/design.md section 4), so a row's draws never depend on its batch neighbours or row index, seeds and
offsets can live in device tensors (CUDA-graph friendly), and the kernels can reproduce the
PyTorch path exactly.

The generator is a chain of ``lowbias32`` mixes (C. Wellons' 32-bit integer hash, a bijection
with very low avalanche bias) over 32-bit words::

    h = mix(seed_lo ^ GOLDEN); h = mix(h ^ seed_hi)
    h = mix(h ^ offset_lo);   h = mix(h ^ offset_hi)
    h = mix(h ^ (position * 4 + stream))            # row_key(): one scalar per (row, position)
    bits = mix(mix(h ^ vocab_index))                # per element: two more mixes

``uniform`` takes the top 24 bits: ``(bits >> 8) * 2**-24`` in [0, 1) (exact in fp32).
``exponential`` is ``-log(((bits >> 9) * 2 + 1) * 2**-24)``: the uniform lies strictly inside
(0, 1), so the result is finite and > 0.

PyTorch has no uint32 arithmetic on every device, so the words are held in int64 tensors and
every multiply is split into 16-bit halves (no product exceeds 2**49, nothing relies on overflow
behaviour). A Triton kernel computes the same words with native uint32 arithmetic, where
multiplication wraps modulo 2**32: the results are identical.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9
MIX_MUL1 = 0x7FEB352D
MIX_MUL2 = 0x846CA68B

#: stream of the accept/reject uniforms (vocab index 0)
STREAM_ACCEPT = 0
#: stream of the exponentials of the recovery race (vocab index = token id)
STREAM_RECOVER = 1

TWO_POW_M24 = 2.0**-24
#: seeds drawn for unseeded rows lie in [0, SEED_HIGH)
SEED_HIGH = 2**62


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32) held in int64, without int64 overflow."""
    lo = c & 0xFFFF
    hi = c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int64 tensors holding uint32 words."""
    x = x ^ (x >> 16)
    x = _mul32(x, MIX_MUL1)
    x = x ^ (x >> 15)
    x = _mul32(x, MIX_MUL2)
    return x ^ (x >> 16)


def split64(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(low, high) uint32 words of an int64 tensor (two's complement for negatives)."""
    v = v.to(torch.int64)
    return v & MASK32, (v >> 32) & MASK32


def row_key(seed: torch.Tensor, offset: torch.Tensor, position: torch.Tensor, stream: int) -> torch.Tensor:
    """Per-(row, position, stream) key. seed, offset, position: broadcastable int64 tensors."""
    seed_lo, seed_hi = split64(seed)
    off_lo, off_hi = split64(offset)
    h = mix32(seed_lo ^ GOLDEN)
    h = mix32(h ^ seed_hi)
    h = mix32(h ^ off_lo)
    h = mix32(h ^ off_hi)
    return mix32(h ^ ((position.to(torch.int64) * 4 + stream) & MASK32))


def element_bits(key: torch.Tensor, vocab_index: torch.Tensor) -> torch.Tensor:
    """32 random bits for (key, vocab index); broadcastable int64 tensors."""
    return mix32(mix32(key ^ vocab_index.to(torch.int64)))


def bits_to_uniform(bits: torch.Tensor) -> torch.Tensor:
    """fp32 uniform in [0, 1) from the top 24 bits."""
    return (bits >> 8).to(torch.float32) * TWO_POW_M24


def bits_to_exponential(bits: torch.Tensor) -> torch.Tensor:
    """fp32 Exp(1) sample, finite and > 0 (uniform strictly inside (0, 1))."""
    u = ((bits >> 9) * 2 + 1).to(torch.float32) * TWO_POW_M24
    return -torch.log(u)


def accept_uniforms(seeds: torch.Tensor, offsets: torch.Tensor, k: int) -> torch.Tensor:
    """Uniforms of the accept test.

    seeds, offsets: [B] int64. Returns [B, k] fp32; entry (b, i) is the uniform of position i.
    """
    pos = torch.arange(k, device=seeds.device, dtype=torch.int64)
    key = row_key(seeds[:, None], offsets[:, None], pos[None, :], STREAM_ACCEPT)
    return bits_to_uniform(element_bits(key, torch.zeros((), dtype=torch.int64, device=seeds.device)))


def recover_exponentials(seeds: torch.Tensor, offsets: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Exponentials of the recovery race.

    seeds, offsets, positions: [N] int64 (positions in [0, k]). Returns [N, vocab_size] fp32.
    """
    key = row_key(seeds, offsets, positions, STREAM_RECOVER)
    vocab = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    return bits_to_exponential(element_bits(key[:, None], vocab[None, :]))
