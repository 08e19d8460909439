"""Baselines the benchmarks time next to our samplers.

Every baseline is built by a ``prepare`` function that takes the standard inputs
(target_with_bonus_probs [B, k+1, V], bonus_token_ids [B, 1], draft_probs [B, k, V],
draft_token_ids [B, k]) and returns a zero-argument callable that runs the baseline's own entry
point once and returns [B, k+1] token ids in the standard layout (drafts, one more token, -1).
Layout conversion that an engine would not do per step (flattening, dtype) happens in
``prepare``, outside the timed call. A baseline that cannot run here raises
:class:`BaselineUnavailable` with the reason.

- ``vllm_v0_torch``: vLLM V0's rejection sampler algorithm in plain PyTorch, written here from
  its description (seeds/: "constructs the recovered distribution for all tokens, even if they
  are accepted", then multinomial sampling): accept iff u < min(1, q(x) / p(x)) with u ~ U(0, 1)
  from torch.rand; the recovered distribution (q - p) clamped below at the smallest positive
  float and normalised is built at every one of the k positions ([B, k, V]); the recovered token
  is sampled at every position by an exponential race (probs / Exp(1), argmax), V0's
  ``_multinomial``. V0 took fp32 only: other dtypes are upcast first, inside the timed call.
- ``vllm_v1``: ``vllm.v1.sample.rejection_sampler.rejection_sample`` (Triton kernels: CUDA only).
  It takes target logits; ``prepare`` passes log(q) so that its softmax returns q.
- ``flashinfer``: ``flashinfer.sampling.chain_speculative_sampling`` (CUDA only). It samples the
  bonus token itself from the last target row.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import types
from collections.abc import Callable
from typing import Any

import torch

from spec_samplers.output import build_output, num_leading_accepted

Prepared = Callable[[], torch.Tensor]


class BaselineUnavailable(RuntimeError):
    """The baseline cannot run here; the message says why."""


class VllmV0RejectionSampler(torch.nn.Module):
    """vLLM V0's rejection sampling algorithm (see the module docstring). Lossless up to the
    smallest-positive clamp of the residual, which V0 documents as a small drift."""

    lossless = True

    def forward(
        self,
        target_with_bonus_probs: torch.Tensor,  # [B, k+1, V]
        bonus_token_ids: torch.Tensor,  # [B, 1]
        draft_probs: torch.Tensor | None,  # [B, k, V]; None: point masses at draft_token_ids
        draft_token_ids: torch.Tensor,  # [B, k]
    ) -> torch.Tensor:
        """Returns [B, k+1] int64 in the standard layout."""
        target_probs = target_with_bonus_probs[:, :-1].to(torch.float32)  # [B, k, V]
        B, k, V = target_probs.shape
        ids = draft_token_ids.to(torch.int64)
        if k == 0:
            return bonus_token_ids.to(torch.int64)
        if draft_probs is None:  # V0 engines passed one-hot probs for draft-free proposers
            draft_probs = torch.nn.functional.one_hot(ids, V).to(torch.float32)
        draft_probs = draft_probs.to(torch.float32)
        # _get_accepted
        selected_draft = draft_probs.gather(2, ids[:, :, None]).squeeze(2)  # [B, k]
        selected_target = target_probs.gather(2, ids[:, :, None]).squeeze(2)  # [B, k]
        uniform = torch.rand(B, k, device=target_probs.device)
        capped_ratio = torch.minimum(selected_target / selected_draft, torch.ones((), device=target_probs.device))
        accepted = uniform < capped_ratio
        # _get_recovered_probs: the full [B, k, V] residual
        f = torch.clamp(target_probs - draft_probs, min=torch.finfo(torch.float32).tiny)
        recovered_probs = (f / f.sum(dim=-1, keepdim=True)).reshape(B * k, V)
        # _multinomial: exponential race over every position
        exponentials = torch.empty_like(recovered_probs).exponential_(1.0)
        recovered = recovered_probs.div_(exponentials).argmax(dim=1).view(B, k)
        num_accepted = num_leading_accepted(accepted)
        rows = torch.arange(B, device=target_probs.device)
        final = torch.where(
            num_accepted < k, recovered[rows, num_accepted.clamp(max=k - 1)], bonus_token_ids[:, 0].to(torch.int64)
        )
        return build_output(ids, num_accepted, final)


def prepare_vllm_v0_torch(target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids) -> Prepared:
    sampler = VllmV0RejectionSampler()
    return lambda: sampler(target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids)


def _cuda_entry(module: str, name: str, distribution: str, label: str, device: torch.device) -> Any:
    """``module.name`` of the installed ``distribution``, whose kernels run on CUDA only, or
    :class:`BaselineUnavailable` saying why not. ``label`` names it in that message, its
    ``{what}`` replaced by the distribution and its version."""
    if importlib.util.find_spec(module.partition(".")[0]) is None:
        raise BaselineUnavailable(f"{distribution} is not installed")
    try:
        what = f"{distribution} {importlib.metadata.version(distribution)}"
    except importlib.metadata.PackageNotFoundError:
        what = distribution
    if device.type != "cuda":
        raise BaselineUnavailable(f"{label.format(what=what)} runs CUDA kernels only; this run's device is {device}")
    try:
        return getattr(importlib.import_module(module), name)
    except Exception as exc:  # noqa: BLE001 - any import failure makes the baseline unavailable
        raise BaselineUnavailable(f"importing {module} failed: {exc!r}") from exc


def prepare_vllm_v1(target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids) -> Prepared:
    device = target_with_bonus_probs.device
    module = "vllm.v1.sample.rejection_sampler"
    rejection_sample = _cuda_entry(module, "rejection_sample", "vllm", module + " ({what}, Triton kernels)", device)
    B, kp1, V = target_with_bonus_probs.shape
    k = kp1 - 1
    target_logits = torch.log(target_with_bonus_probs[:, :k].to(torch.float32)).reshape(B * k, V).contiguous()
    flat_draft = None if draft_probs is None else draft_probs.to(torch.float32).reshape(B * k, V).contiguous()
    flat_ids = draft_token_ids.to(torch.int32).reshape(B * k).contiguous()
    cu_num = torch.arange(1, B + 1, device=device, dtype=torch.int32) * k
    bonus = bonus_token_ids.to(torch.int32).contiguous()
    metadata = types.SimpleNamespace(  # the fields rejection_sample reads, all-random sampling
        temperature=torch.ones(B, device=device),
        all_greedy=False,
        all_random=True,
        top_p=None,
        top_k=None,
        generators={},
    )

    def run() -> torch.Tensor:
        # rejection_sample allocates its softmax and output, so the prepared inputs can be reused
        # (a namespace with the fields rejection_sample reads, not vLLM's SamplingMetadata class)
        return rejection_sample(flat_ids, [k] * B, k, cu_num, flat_draft, target_logits, bonus, metadata)

    return run


def prepare_flashinfer(target_with_bonus_probs, bonus_token_ids, draft_probs, draft_token_ids) -> Prepared:
    label = "flashinfer.sampling.chain_speculative_sampling ({what})"
    chain_speculative_sampling = _cuda_entry(
        "flashinfer.sampling", "chain_speculative_sampling", "flashinfer-python", label, target_with_bonus_probs.device
    )
    if draft_probs is None:
        raise BaselineUnavailable("chain_speculative_sampling needs draft_probs")
    target = target_with_bonus_probs.to(torch.float32).contiguous()
    draft = draft_probs.to(torch.float32).contiguous()
    ids = draft_token_ids.to(torch.int32).contiguous()

    def run() -> torch.Tensor:
        out = chain_speculative_sampling(draft, ids, target)
        return out[0] if isinstance(out, tuple) else out

    return run


#: name -> prepare function
BASELINES: dict[str, Callable[..., Prepared]] = {
    "vllm_v0_torch": prepare_vllm_v0_torch,
    "vllm_v1": prepare_vllm_v1,
    "flashinfer": prepare_flashinfer,
}


def availability(device: torch.device) -> dict[str, dict[str, object]]:
    """{name: {"available": bool, "reason": str}} for ``device``, from a tiny trial call."""
    result = {}
    tiny = (
        torch.full((1, 2, 4), 0.25, device=device),
        torch.zeros((1, 1), dtype=torch.int64, device=device),
        torch.full((1, 1, 4), 0.25, device=device),
        torch.zeros((1, 1), dtype=torch.int64, device=device),
    )
    for name, prepare in BASELINES.items():
        try:
            prepare(*tiny)()
            result[name] = {"available": True, "reason": ""}
        except BaselineUnavailable as exc:
            result[name] = {"available": False, "reason": str(exc)}
        except Exception as exc:  # noqa: BLE001 - a baseline that crashes is reported, not fatal
            result[name] = {"available": False, "reason": f"trial call failed: {exc!r}"}
    return result
