"""Prompts in, tokens and per-request statistics out: what the decoding loops share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import torch

from spec_samplers.constants import input_error
from spec_samplers.decoding.interfaces import PAD_TOKEN_ID, LanguageModel
from spec_samplers.sampling_params import SamplingParams, as_params_list


def as_prompts(prompt_ids: torch.Tensor | Sequence[Sequence[int]], vocab_size: int | None = None) -> list[list[int]]:
    """Prompts as lists of ids: a [B, P] integer tensor (every prompt P tokens) or B sequences of
    different lengths. Each prompt needs at least one token; ids must lie in [0, vocab_size)."""
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dim() != 2 or prompt_ids.is_floating_point():
            raise input_error(
                "prompt_ids",
                "an integer tensor [B, P] or a list of id lists",
                f"{tuple(prompt_ids.shape)} {prompt_ids.dtype}",
            )
        prompts = [list(map(int, row)) for row in prompt_ids.tolist()]
    elif isinstance(prompt_ids, Sequence) and not isinstance(prompt_ids, (str, bytes)):
        prompts = []
        for b, row in enumerate(prompt_ids):
            row = row.tolist() if isinstance(row, torch.Tensor) else row
            if not isinstance(row, Sequence) or not all(isinstance(t, int) and not isinstance(t, bool) for t in row):
                raise input_error(f"prompt_ids[{b}]", "a sequence of int token ids", type(row).__name__)
            prompts.append(list(row))
    else:
        raise input_error("prompt_ids", "an integer tensor [B, P] or a list of id lists", type(prompt_ids).__name__)
    for b, row in enumerate(prompts):
        if not row:
            raise input_error(f"prompt_ids[{b}]", "at least one token", "an empty prompt")
        bad = [t for t in row if t < 0 or (vocab_size is not None and t >= vocab_size)]
        if bad:
            raise input_error(
                f"prompt_ids[{b}]", f"token ids in [0, {vocab_size if vocab_size is not None else 'V'})", bad[0]
            )
    return prompts


def left_pad(rows: Sequence[Sequence[int]], width: int, device: torch.device) -> torch.Tensor:
    """[B, width] int64 with each row's last ``width`` ids right-aligned, -1 (padding) before."""
    out = torch.full((len(rows), width), PAD_TOKEN_ID, dtype=torch.int64)
    for b, row in enumerate(rows):  # host data, once per generate
        tail = list(row)[-width:] if width else []
        if tail:
            out[b, width - len(tail) :] = torch.tensor(tail, dtype=torch.int64)
    return out.to(device)


def stop_token_ids(model: LanguageModel) -> tuple[int, ...]:
    """The model's EOS ids: ``eos_token_ids`` if it has them, else ``eos_token_id``; () when the
    configuration has none (``eos_token_id`` raises ValueError, as the seed says)."""
    many = getattr(model, "eos_token_ids", None)
    if many is not None:
        return tuple(int(t) for t in many)
    try:
        return (int(model.eos_token_id),)
    except ValueError:
        return ()


def model_device(model: LanguageModel) -> torch.device:
    device = getattr(model, "device", None)
    return torch.device(device) if device is not None else torch.device("cpu")


class RoundTarget(NamedTuple):
    """The target's view of one round's emitted tokens, for observers that report scores: emitted
    token j of row m was drawn from ``probs[m, positions[m, j]]`` (the processed target distribution),
    scored by ``logits[m, positions[m, j]]`` (the target's raw logits). Tensors on the model's device."""

    logits: torch.Tensor  # [M, Q, V]
    probs: torch.Tensor  # [M, Q, V] fp32
    positions: torch.Tensor  # [M, W] int64: the query position behind each emitted token


class RoundObserver(Protocol):
    """Sees every round's tokens before they are committed (``SpeculativeDecoder.generate(observer=)``):
    it may end a request early (stopping criteria) and watch what is kept (streaming, scores)."""

    def __call__(
        self,
        rows: torch.Tensor,  # [M] int64: the requests (original batch index)
        new: torch.Tensor,  # [M, W] int64 host: the round's tokens
        keep: torch.Tensor,  # [M] int64: how many of them EOS and max_new_tokens let through
        have: torch.Tensor,  # [M] int64: tokens each request held before the round
        target: RoundTarget | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens to keep [M] int64, each <= keep; stop [M] bool: the request ends after them)."""
        ...


class TokenBuffer:
    """Host-side output [B, <= max_new_tokens] with per-request EOS and length limits (vectorised),
    and an optional :class:`RoundObserver`. The storage grows (doubling) with the longest request,
    never allocated at max_new_tokens up front: a huge limit costs nothing until it is generated."""

    #: initial width of the storage (tokens per request)
    INITIAL_WIDTH = 64

    def __init__(
        self,
        batch_size: int,
        max_new_tokens: int,
        eos_token_ids: Sequence[int],
        observer: RoundObserver | None = None,
    ) -> None:
        self._storage = torch.full(
            (batch_size, min(max_new_tokens, self.INITIAL_WIDTH)), PAD_TOKEN_ID, dtype=torch.int64
        )
        self.num_tokens = torch.zeros(batch_size, dtype=torch.int64)
        self.finished_by_eos = torch.zeros(batch_size, dtype=torch.bool)
        self.max_new_tokens = max_new_tokens
        self.eos = torch.tensor(list(eos_token_ids), dtype=torch.int64)
        self.observer = observer

    @property
    def token_ids(self) -> torch.Tensor:
        """[B, L] int64, L the longest request's token count: -1 after each request's last token."""
        longest = int(self.num_tokens.max()) if self.num_tokens.numel() else 0
        return self._storage[:, :longest]

    def _reserve(self, width: int) -> None:
        """Storage for ``width`` tokens per request (at most max_new_tokens), doubling."""
        have = self._storage.shape[1]
        if width <= have:
            return
        grown = torch.full(
            (self._storage.shape[0], min(max(width, 2 * have), self.max_new_tokens)), PAD_TOKEN_ID, dtype=torch.int64
        )
        grown[:, :have] = self._storage
        self._storage = grown

    def append(
        self, rows: torch.Tensor, new: torch.Tensor, num_new: torch.Tensor, target: RoundTarget | None = None
    ) -> torch.Tensor:
        """Append ``new[m, :num_new[m]]`` to request ``rows[m]`` (host tensors [M], [M, W], [M]),
        stopping after an EOS, at max_new_tokens or where the observer says. ``target``: what the
        observer may report as scores. Returns [M] bool: the request is finished."""
        M, W = new.shape
        j = torch.arange(W)[None, :]
        emitted = j < num_new[:, None]
        is_eos = emitted & torch.isin(new, self.eos) if self.eos.numel() else torch.zeros_like(emitted)
        first_eos = torch.where(is_eos.any(dim=1), is_eos.to(torch.int64).argmax(dim=1), W)
        have = self.num_tokens[rows]
        keep = torch.minimum(torch.minimum(num_new, first_eos + 1), self.max_new_tokens - have)  # [M]
        stopped = torch.zeros(M, dtype=torch.bool)
        if self.observer is not None:
            keep, stopped = self.observer(rows, new, keep, have, target)
        if M:
            self._reserve(int((have + keep).max()))
        mask = j < keep[:, None]
        self._storage[rows[:, None].expand(M, W)[mask], (have[:, None] + j)[mask]] = new[mask]
        self.num_tokens[rows] = have + keep
        eos_hit = first_eos < keep
        self.finished_by_eos[rows] = eos_hit
        return eos_hit | stopped | (have + keep >= self.max_new_tokens)


@dataclass
class GenerationStart:
    """What both generate loops start from: the validated prompts, one SamplingParams per request
    and the output buffer (up to max_new_tokens per request, stopping at the model's EOS)."""

    prompts: list[list[int]]
    params: list[SamplingParams]
    buffer: TokenBuffer

    @property
    def batch_size(self) -> int:
        return len(self.prompts)


def start_generation(
    model: LanguageModel,
    prompt_ids: torch.Tensor | Sequence[Sequence[int]],
    max_new_tokens: int,
    sampling_params: SamplingParams | Sequence[SamplingParams] | None,
    observer: RoundObserver | None = None,
) -> GenerationStart:
    """Checks a generate call's arguments against ``model`` (the target: its vocabulary bounds the
    prompt ids, its EOS ends a request) and sets up the output (seen by ``observer``)."""
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise input_error("max_new_tokens", "an int >= 0", repr(max_new_tokens))
    prompts = as_prompts(prompt_ids, getattr(model, "vocab_size", None))
    params = as_params_list(sampling_params, len(prompts))
    return GenerationStart(prompts, params, TokenBuffer(len(prompts), max_new_tokens, stop_token_ids(model), observer))


@dataclass
class RequestStats:
    """Statistics of one request.

    ``num_drafted``: k per round; ``num_verified``: drafts the sampler judged (those whose
    predecessors were all accepted); ``accepted_per_position[i]``: rounds in which the draft at
    position i was accepted (``acceptance_per_position[i]`` = that / rounds, vLLM's per-position
    acceptance); ``expected_accepted``: the sum over judged drafts of sum_x min(p'(x), q'(x)) of
    the processed draft and target distributions, which is what a lossless sampler accepts on
    average (``verified_acceptance_rate`` vs ``expected_acceptance_rate``).
    """

    num_generated: int
    num_drafted: int = 0
    num_accepted: int = 0
    num_verified: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    num_rounds: int = 0
    target_forward_passes: int = 0
    draft_forward_passes: int = 0
    expected_accepted: float = 0.0
    finished_by_eos: bool = False

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (nan before any draft)."""
        return self.num_accepted / self.num_drafted if self.num_drafted else float("nan")

    @property
    def verified_acceptance_rate(self) -> float:
        """Accepted / judged drafts."""
        return self.num_accepted / self.num_verified if self.num_verified else float("nan")

    @property
    def expected_acceptance_rate(self) -> float:
        """What a lossless sampler's verified_acceptance_rate is on average."""
        return self.expected_accepted / self.num_verified if self.num_verified else float("nan")

    @property
    def acceptance_per_position(self) -> list[float]:
        return [a / self.num_rounds if self.num_rounds else float("nan") for a in self.accepted_per_position]

    @property
    def tokens_per_target_pass(self) -> float:
        """Generated tokens per target forward pass (the prefill counts as one)."""
        return self.num_generated / self.target_forward_passes if self.target_forward_passes else float("nan")


@dataclass
class GenerationOutput:
    """``token_ids`` [B, L] int64, L the longest request's token count (<= max_new_tokens), -1
    after a request's EOS (the EOS itself is kept) or after its last token; ``stats`` one
    :class:`RequestStats` per request."""

    token_ids: torch.Tensor
    stats: list[RequestStats]

    @property
    def num_tokens(self) -> list[int]:
        return [s.num_generated for s in self.stats]

    def sequences(self) -> list[list[int]]:
        """Each request's generated ids without the -1 padding."""
        return [row[: s.num_generated] for row, s in zip(self.token_ids.tolist(), self.stats)]

    def _total(self, name: str) -> float:
        return float(sum(getattr(s, name) for s in self.stats))

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens over every request."""
        drafted = self._total("num_drafted")
        return self._total("num_accepted") / drafted if drafted else float("nan")

    @property
    def verified_acceptance_rate(self) -> float:
        """Accepted / judged drafts over every request."""
        verified = self._total("num_verified")
        return self._total("num_accepted") / verified if verified else float("nan")

    @property
    def expected_acceptance_rate(self) -> float:
        """sum_x min(p', q') averaged over the judged drafts: a lossless sampler's expected
        verified_acceptance_rate."""
        verified = self._total("num_verified")
        return self._total("expected_accepted") / verified if verified else float("nan")

    @property
    def acceptance_per_position(self) -> list[float]:
        rounds = self._total("num_rounds")
        k = max((len(s.accepted_per_position) for s in self.stats), default=0)
        return [
            sum(s.accepted_per_position[i] for s in self.stats) / rounds if rounds else float("nan") for i in range(k)
        ]

    @property
    def tokens_per_target_pass(self) -> float:
        passes = self._total("target_forward_passes")
        return self._total("num_generated") / passes if passes else float("nan")
