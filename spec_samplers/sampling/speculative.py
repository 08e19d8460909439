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
from spec_samplers.kernels.backend import check_backend, launch_config, use_triton
from spec_samplers.kernels.sampling_launch import row_seeds_triton
from spec_samplers.rng import derive_row_seeds
from spec_samplers.validation import resolve_seeds


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
    from spec_samplers.cpu import compiled_op, run_compiled
    from spec_samplers.kernels.rejection_launch import rejection_triton
    from spec_samplers.layout import VerifyBatch
    from spec_samplers.reference import rejection_accepts_reference, rejection_reference
    from spec_samplers.validation import check_metadata, require_tensor

    require_tensor("draft_token_ids", draft_token_ids)
    device = target_probs.device if isinstance(target_probs, torch.Tensor) else draft_token_ids.device
    B = draft_token_ids.shape[0] if draft_token_ids.dim() >= 1 else 0
    bonus = torch.full((B, 1), -1, dtype=torch.int64, device=device)  # none given: sample the bonus row
    check_metadata(target_probs, bonus, draft_probs, draft_token_ids, "target_probs", "draft_probs")
    counters = []
    for name, t in (
        ("maybe_output_accepted_token_num", maybe_output_accepted_token_num),
        ("maybe_output_emitted_draft_token_num", maybe_output_emitted_draft_token_num),
    ):
        if t is None:
            t = torch.zeros(B, dtype=torch.int32, device=device)
        elif not isinstance(t, torch.Tensor) or tuple(t.shape) != (B,) or t.device != device:
            raise input_error(
                name, f"None or a tensor of shape ({B},) on {device}", getattr(t, "shape", type(t).__name__)
            )
        counters.append(t)
    seeds, offsets, shared_offset = resolve_seeds(seed, offset, generator, B, device)
    config = launch_config()
    kernels = use_triton(check_backend(backend), device, config)
    if shared_offset is not None:  # one seed for the batch: the rows' own seeds derive from it
        if kernels:  # the kernels' path: the kernel twin
            seeds = row_seeds_triton(seeds, shared_offset, B, config=config)
        else:
            seeds = derive_row_seeds(seeds, shared_offset, B)
    batch = VerifyBatch.padded(target_probs, bonus, draft_probs, draft_token_ids, seeds=seeds, offsets=offsets)
    compiled = compiled_op(rejection_reference, device) if backend == "auto" else None
    if kernels:
        out = rejection_triton(batch, config=config)
    elif compiled is not None:  # CPU tensors: the reference's compiled twin (spec_samplers.cpu)
        out = run_compiled(compiled, batch)
    else:
        out = run_chunked(rejection_reference, batch)
    accepted = rejection_accepts_reference(batch).sum(dim=1)
    emitted = (out != -1).sum(dim=1) - 1
    counters[0].add_(accepted.to(counters[0].dtype))
    counters[1].add_(emitted.to(counters[1].dtype))
    return out.to(torch.int32), counters[0], counters[1]
