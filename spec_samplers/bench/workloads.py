"""Draft/target distribution pairs for the benchmarks.

A *setting* is a family of C *contexts*; context c is one pair (q_c, p_c) of target and draft
distributions over V tokens. The quality runner repeats each context over many rows and uses the
same pair at all k draft positions, so the per-position acceptance of a lossless sampler is
exactly a_c = sum_x min(p_c(x), q_c(x)) and the theory is closed-form (see ``quality``).

Kinds of setting:
    softmax  q = softmax(z / T), p = softmax((z + sigma * noise) / T), z ~ 3 * N(0, 1)
    sparse   the same, each truncated to its own top-``top_k`` tokens and renormalised
             (top-k-sampled draft and target: supports differ, so p puts mass where q has none)
    point    q = softmax(z / T), p = point mass on argmax(z + sigma * noise): a draft-free
             proposer (n-gram, greedy draft); the samplers get ``draft_probs=None``
    file     pairs loaded with :func:`load_pairs` (``--from-file``)

``--from-file`` layout: a ``.pt`` file holding a dict (``torch.save``) or a ``.safetensors``
file with the keys ``target_probs`` [N, V] and ``draft_probs`` [N, V] (float; any float dtype).
Row n is one context: the target's and the draft's next-token distributions at the same step.
Rows are renormalised to sum to 1; a row with no positive mass is an error.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import torch

KINDS = ("softmax", "sparse", "point", "file")


def synthetic_pair(
    num_rows: int, vocab_size: int, sigma: float, temperature: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """target = softmax(z / T), draft = softmax((z + sigma * noise) / T). Returns ([N, V], [N, V])."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(num_rows, vocab_size, generator=gen) * 3.0
    noise = torch.randn(num_rows, vocab_size, generator=gen)
    return torch.softmax(z / temperature, -1), torch.softmax((z + sigma * noise) / temperature, -1)


@dataclass(frozen=True)
class Setting:
    """One family of draft/target pairs (see the module docstring for ``kind``)."""

    name: str
    kind: str
    vocab_size: int
    contexts: int
    sigma: float = 0.0
    temperature: float = 1.0
    top_k: int = 0  # sparse only: support size of each distribution
    source: str = ""  # file only: the path

    @property
    def point_mass_drafts(self) -> bool:
        """True when the samplers get ``draft_probs=None`` (draft-free proposer)."""
        return self.kind == "point"

    def describe(self) -> dict[str, object]:
        return asdict(self)


def softmax_setting(sigma: float, temperature: float, vocab_size: int, contexts: int) -> Setting:
    return Setting(
        f"softmax s={sigma:g} T={temperature:g} V={vocab_size}", "softmax", vocab_size, contexts, sigma, temperature
    )


def sparse_setting(sigma: float, top_k: int, vocab_size: int, contexts: int) -> Setting:
    return Setting(f"top{top_k} s={sigma:g} V={vocab_size}", "sparse", vocab_size, contexts, sigma, 1.0, top_k)


def point_setting(sigma: float, vocab_size: int, contexts: int) -> Setting:
    return Setting(f"point s={sigma:g} V={vocab_size}", "point", vocab_size, contexts, sigma, 1.0)


def default_settings(quick: bool = False) -> list[Setting]:
    """The embedded workload: a sigma x T grid, sparse and point-mass pairs, and one pair family
    at a real vocabulary size (32000). ``quick``: a tiny subset for tests."""
    if quick:
        return [
            softmax_setting(0.5, 1.0, 256, 2),
            softmax_setting(2.0, 1.0, 256, 2),
            sparse_setting(1.0, 8, 256, 2),
            point_setting(1.0, 256, 2),
        ]
    settings = [softmax_setting(s, t, 1000, 4) for t in (0.5, 1.0, 2.0) for s in (0.25, 0.5, 1.0, 2.0, 4.0)]
    settings += [sparse_setting(s, 20, 1000, 4) for s in (0.5, 2.0)]
    settings += [point_setting(s, 1000, 4) for s in (0.5, 2.0)]
    settings.append(softmax_setting(1.0, 1.0, 32000, 2))
    return settings


def make_pairs(setting: Setting, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(target [C, V], draft [C, V]) fp32 on the CPU for a synthetic setting. For ``point``
    the draft rows are one-hot (the theory treats them as distributions like any other)."""
    C, V = setting.contexts, setting.vocab_size
    target, draft = synthetic_pair(C, V, setting.sigma, setting.temperature, seed)
    if setting.kind == "softmax":
        return target, draft
    if setting.kind == "sparse":
        return _top_k_renorm(target, setting.top_k), _top_k_renorm(draft, setting.top_k)
    if setting.kind == "point":
        point = torch.zeros_like(draft)
        point.scatter_(1, draft.argmax(dim=1, keepdim=True), 1.0)
        return target, point
    raise ValueError(f"setting kind: expected one of {', '.join(KINDS[:3])} for synthetic pairs, got {setting.kind!r}")


def _top_k_renorm(probs: torch.Tensor, top_k: int) -> torch.Tensor:
    """probs: [C, V]. Keep each row's top_k entries, renormalised."""
    values, index = probs.topk(min(top_k, probs.shape[1]), dim=1)
    out = torch.zeros_like(probs).scatter_(1, index, values)
    return out / out.sum(dim=1, keepdim=True)


def load_pairs(path: str) -> tuple[Setting, torch.Tensor, torch.Tensor]:
    """Load ``--from-file`` pairs (layout in the module docstring).

    Returns (setting, target [N, V] fp32, draft [N, V] fp32) on the CPU.
    """
    if os.path.isdir(path):
        raise ValueError(f"--from-file {path!r}: expected a file (.pt or .safetensors), got a directory")
    if not os.path.isfile(path):
        raise ValueError(f"--from-file: no such file {path!r}")
    if path.endswith(".safetensors"):
        try:
            from safetensors.torch import load_file
        except ImportError as exc:
            raise ValueError(
                f"--from-file {path!r}: reading .safetensors needs the safetensors package "
                "(pip install safetensors), or save the tensors with torch.save to a .pt file"
            ) from exc
    try:
        if path.endswith(".safetensors"):
            data = load_file(path)
        else:
            data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a file of another format fails in the reader's own way (pickle, zip, header...)
        kind = "a .safetensors file" if path.endswith(".safetensors") else "a torch.save file (.pt)"
        raise ValueError(
            f"--from-file {path!r}: expected {kind} holding a dict of target_probs and draft_probs; "
            f"could not read it: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc
    if not isinstance(data, dict):
        raise ValueError(
            f"--from-file {path!r}: expected a dict with keys target_probs and draft_probs, got {type(data).__name__}"
        )
    missing = [key for key in ("target_probs", "draft_probs") if key not in data]
    if missing:
        raise ValueError(
            f"--from-file {path!r}: expected keys target_probs and draft_probs, missing {missing}; found {sorted(data)}"
        )
    target = _checked_rows("target_probs", data["target_probs"])
    draft = _checked_rows("draft_probs", data["draft_probs"])
    if target.shape != draft.shape:
        raise ValueError(
            f"--from-file: draft_probs: expected the shape of target_probs {tuple(target.shape)}, "
            f"got {tuple(draft.shape)}"
        )
    name = f"file {os.path.basename(path)} V={target.shape[1]}"
    return Setting(name, "file", target.shape[1], target.shape[0], source=path), target, draft


def _checked_rows(key: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise ValueError(
            f"--from-file: {key}: expected a float tensor [N, V], got {type(t).__name__}"
            + (f" of dtype {t.dtype}" if isinstance(t, torch.Tensor) else "")
        )
    if t.dim() != 2 or t.shape[0] < 1 or t.shape[1] < 2:
        raise ValueError(f"--from-file: {key}: expected shape [N, V] with N >= 1 and V >= 2, got {tuple(t.shape)}")
    t = t.to(torch.float32)
    if not bool(torch.isfinite(t).all()) or bool((t < 0).any()):
        raise ValueError(f"--from-file: {key}: expected finite, non-negative probabilities")
    sums = t.sum(dim=1, keepdim=True)
    if bool((sums <= 0).any()):
        row = int((sums <= 0).nonzero()[0, 0])
        raise ValueError(f"--from-file: {key}: expected every row to have positive mass, row {row} has none")
    return t / sums


def timing_inputs(
    batch_size: int, k: int, vocab_size: int, dtype: torch.dtype, device: torch.device, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Inputs for one timed call (softmax pairs, sigma = 1, T = 1), generated on ``device``.

    Returns target_with_bonus_probs [B, k+1, V] and draft_probs [B, k, V] in ``dtype``,
    draft_token_ids [B, k] and bonus_token_ids [B, 1] int64.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    B, V = batch_size, vocab_size
    z = torch.randn(B, k + 1, V, generator=gen, device=device) * 3.0
    noise = torch.randn(B, k, V, generator=gen, device=device)
    target = torch.softmax(z, -1)
    draft = torch.softmax(z[:, :k] + noise, -1)
    draft_ids = torch.multinomial(draft.reshape(-1, V), 1, generator=gen).view(B, k)
    bonus = torch.multinomial(target[:, k], 1, generator=gen).view(B, 1)
    return {
        "target_with_bonus_probs": target.to(dtype),
        "draft_probs": draft.to(dtype),
        "draft_token_ids": draft_ids,
        "bonus_token_ids": bonus,
    }
