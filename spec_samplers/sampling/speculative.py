"""FlashInfer's ``chain_speculative_sampling``, run by this package's lossless rejection sampler.

It runs the rejection sampler's op (its kernels, its reference's compiled CPU twin or its reference,
chosen as :meth:`spec_samplers.base.SpecDecodeBaseSampler._choose_op` does) without the sampler
class, so the sampling package stays below the samplers (their ``sampling_params=`` processing
runs on its operations; see tests/test_layers.py).
"""

from __future__ import annotations

import torch

from spec_samplers.chunking import run_chunked
from spec_samplers.constants import input_error
from spec_samplers.kernels.backend import LaunchConfig, _tracing_fake, check_backend, launch_config, use_triton
from spec_samplers.kernels.sampling_launch import chain_counts_triton, request_seeds_triton
from spec_samplers.kernels.verify_launch import rejection_triton
from spec_samplers.layout import VerifyBatch
from spec_samplers.rng import derive_row_seeds
from spec_samplers.validation import kernel_seeds, resolve_seeds


def chain_speculative_sampling(
    draft_probs: torch.Tensor,  # [B, n, V] fp32/fp16/bf16
    draft_token_ids: torch.Tensor,  # [B, n] int32/int64
    target_probs: torch.Tensor,  # [B, n+1, V] fp32/fp16/bf16
    maybe_output_accepted_token_num: torch.Tensor | None = None,  # [B], added to in place
    maybe_output_emitted_draft_token_num: torch.Tensor | None = None,  # [B], added to in place
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chain speculative sampling with FlashInfer's signature, run by this package's lossless
    rejection sampler (:class:`spec_samplers.RejectionSampler`'s reference and kernels).

    Returns (output_token_ids [B, n+1] int32: accepted drafts, then the recovered token or, after
    n acceptances, a sample of the bonus row target_probs[:, n]; -1 after; accepted_num [B];
    emitted_num [B]). accepted_num counts the drafts that pass the accept test each on its own
    (FlashInfer: "if each token is considered independently"), emitted_num the accepted prefix
    (drafts emitted, without the final token). Given counter tensors are added to in place and
    returned; otherwise new int32 tensors are.

    Example::

        >>> import torch, spec_samplers.sampling as sampling
        >>> B, n, V = 2, 3, 16
        >>> draft = torch.softmax(torch.randn(B, n, V), -1)
        >>> ids = torch.multinomial(draft.view(-1, V), 1).view(B, n)
        >>> target = torch.softmax(torch.randn(B, n + 1, V), -1)
        >>> out, accepted, emitted = sampling.chain_speculative_sampling(draft, ids, target)
    """
    from spec_samplers.validation import check_metadata, require_tensor

    require_tensor("draft_token_ids", draft_token_ids)
    device = target_probs.device if isinstance(target_probs, torch.Tensor) else draft_token_ids.device
    B = draft_token_ids.shape[0] if draft_token_ids.dim() >= 1 else 0
    config = launch_config()
    kernels = use_triton(check_backend(backend), device, config)
    # none given: sample the bonus row (the kernels read a kept buffer of -1: no op per call)
    bonus = _no_bonus(B, device) if kernels else torch.full((B, 1), -1, dtype=torch.int64, device=device)
    check_metadata(target_probs, bonus, draft_probs, draft_token_ids, "target_probs", "draft_probs")
    given = []
    for name, t in (
        ("maybe_output_accepted_token_num", maybe_output_accepted_token_num),
        ("maybe_output_emitted_draft_token_num", maybe_output_emitted_draft_token_num),
    ):
        if t is not None and (not isinstance(t, torch.Tensor) or tuple(t.shape) != (B,) or t.device != device):
            raise input_error(
                name, f"None or a tensor of shape ({B},) on {device}", getattr(t, "shape", type(t).__name__)
            )
        given.append(t)
    if kernels:
        return _chain_triton(draft_probs, draft_token_ids, target_probs, bonus, given, generator, seed, offset, config)
    from spec_samplers.cpu import compiled_op, run_compiled
    from spec_samplers.reference import rejection_accepts_reference, rejection_reference

    counters = [torch.zeros(B, dtype=torch.int32, device=device) if t is None else t for t in given]
    seeds, offsets, shared_offset = resolve_seeds(seed, offset, generator, B, device)
    if shared_offset is not None:  # one seed for the batch: the rows' own seeds derive from it
        seeds = derive_row_seeds(seeds, shared_offset, B)
    batch = VerifyBatch.padded(target_probs, bonus, draft_probs, draft_token_ids, seeds=seeds, offsets=offsets)
    compiled = compiled_op(rejection_reference, device) if backend == "auto" else None
    if compiled is not None:  # CPU tensors: the reference's compiled twin (spec_samplers.cpu)
        out = run_compiled(compiled, batch)
    else:
        out = run_chunked(rejection_reference, batch)
    accepted = rejection_accepts_reference(batch).sum(dim=1)
    emitted = (out != -1).sum(dim=1) - 1
    counters[0].add_(accepted.to(counters[0].dtype))
    counters[1].add_(emitted.to(counters[1].dtype))
    return out.to(torch.int32), counters[0], counters[1]


def _chain_triton(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    bonus: torch.Tensor,  # [B, 1] of -1
    given: list[torch.Tensor | None],  # the two counters as given
    generator: torch.Generator | None,
    seed: int | torch.Tensor | None,
    offset: int | torch.Tensor | None,
    config: LaunchConfig | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernels' path: the rows' seeds and offsets (one launch, unless given per row), the
    rejection kernel, the counters and the int32 output (one launch): at most three launches,
    and a seed draw (one op) when the generator gives the seeds."""
    B, device = draft_token_ids.shape[0], draft_token_ids.device
    rnd = kernel_seeds(seed, offset, generator, B, device)
    seeds, offsets = rnd["seeds"], rnd["offsets"]
    per_row = not rnd["derive"] and isinstance(seeds, torch.Tensor) and seeds.shape[0] == B
    per_row_offsets = offsets.shape[0] == B if isinstance(offsets, torch.Tensor) else offsets == 0
    if not (per_row and per_row_offsets):
        seeds, offsets = request_seeds_triton(seeds, offsets, rnd["derive"], B, device, config=config)
    elif not isinstance(offsets, torch.Tensor):  # offset 0 for every row: the kernels' default
        offsets = None
    batch = VerifyBatch.padded(target_probs, bonus, draft_probs, draft_token_ids, seeds=seeds, offsets=offsets)
    out = rejection_triton(batch, config=config)
    counters = [torch.empty(B, dtype=torch.int32, device=device) if t is None else t for t in given]
    add = (given[0] is not None, given[1] is not None)
    tokens = chain_counts_triton(batch, out, counters[0], counters[1], add, config=config)
    return tokens, counters[0], counters[1]


#: (device type, index) -> a kept [>= B] int64 buffer of -1: the bonus ids "none given"
_NO_BONUS: dict[tuple[str, int | None], torch.Tensor] = {}


def _no_bonus(B: int, device: torch.device) -> torch.Tensor:
    """[B, 1] int64 -1, a view of a buffer kept per device (read only; grown for a larger B)."""
    if _tracing_fake():
        # a tool counting ops on fake tensors: a warm call finds the buffer kept (no op)
        return torch.empty((B, 1), dtype=torch.int64, device=device)
    key = (device.type, device.index)
    buf = _NO_BONUS.get(key)
    if buf is None or buf.numel() < B:
        buf = torch.full((max(1024, B),), -1, dtype=torch.int64, device=device)
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            _NO_BONUS[key] = buf
    return buf[:B].view(B, 1)
