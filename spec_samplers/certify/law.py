"""The target's exact law of the first m generated tokens, and the test of N samples against it.

**The law.** :func:`target_law` computes, with the target model itself (a transformers causal LM,
fp32, no cache, no speculation), the probability of every continuation of ``prompt`` by the
first ``num_tokens`` generated tokens, under a request's sampling parameters processed as an
engine processes them:

* ``processing="vllm"``: softmax(logits / T), then min-p, top-k, top-p, each renormalised
  (:func:`spec_samplers.sampling_params.process_logits`, vLLM's order);
* ``processing="transformers"``: transformers' own warpers in ``generate``'s order (temperature,
  top-k, top-p, min-p, with ``min_tokens_to_keep=1``).

The continuations form a tree of prefixes. A prefix is *expanded* (its children computed by one
more forward) when its probability is at least ``min_prob``; the children of an expanded prefix
whose probability is below ``min_prob`` are lumped into one cell "prefix, then one of the small
ones" with their exact total mass. Every cell's probability is therefore exact; with
``min_prob=0`` (the default, for small vocabularies) every cell is one full continuation. A
continuation ends early at a stop token (``stop_token_ids``; none by default, as with vLLM's
``ignore_eos``).

**The test.** :func:`check_samples` tests N generated continuations against the laws of their
prompts. For the joint law of the m tokens and for each position's marginal (token j, or
"other" when the continuation was lumped before position j):

* the total-variation distance between the empirical and the exact law, with a confidence
  interval at level 1 - alpha that holds for any sample size (McDiarmid: TV(p_hat, p) has
  bounded differences 1/N, and E TV(p_hat, p) <= sqrt(K / N) / 2 over K cells);
* Pearson's chi-square goodness of fit with cells of expected count below 5 pooled (the
  product-multinomial statistic over prompts: the per-prompt statistics add, and so do their
  degrees of freedom);
* a sample in a cell the target gives probability 0 is evidence of loss on its own.

The verdict fails when a token of probability 0 appears or when any of the m + 1 chi-square tests
rejects at alpha / (m + 1) (Bonferroni): for an exact engine, a false failure has probability at
most alpha (asymptotically, as every chi-square test). :func:`samples_needed` gives the N at which
the joint test detects, with probability ``power``, any engine whose joint law is at TV distance
``detectable_tv`` or more from the target's on the test's cells (noncentral chi-square with
Patnaik's approximation; an engine at TV d has noncentrality at least 4 N d^2 by Cauchy-Schwarz).

Only torch is needed (chi-square tails from ``torch.special.gammaincc``); the model is any
``transformers`` causal LM.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from spec_samplers.constants import input_error
from spec_samplers.sampling_params import SamplingParams, process_logits

PROCESSINGS = ("vllm", "transformers")
#: chi-square cells with a smaller expected count are pooled into one
MIN_EXPECTED = 5.0
#: a cell label for "one of the lumped children" in a position's marginal and in the joint
OTHER = -2
#: a position's label for "the continuation stopped before this position"
ENDED = -3


# --------------------------------------------------------------------------------------------
# the law
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """An expanded prefix: its kept children with their probabilities (given the prefix), the
    mass of its lumped children, and which tokens have probability 0 after processing."""

    children: dict[int, float]
    lumped: float
    zero: torch.Tensor  # [V] bool, True where the processed probability is exactly 0


@dataclass(frozen=True)
class Cell:
    """A cell of the law: the continuation ``tokens`` (shorter than m only at a stop token), or,
    when ``lumped``, "``tokens`` then one of the lumped children of that prefix"."""

    tokens: tuple[int, ...]
    lumped: bool = False


@dataclass
class TargetLaw:
    """The target's exact law of the first ``num_tokens`` generated tokens after ``prompt``.

    ``cells`` and ``probs`` [K] (float64, summing to 1 up to rounding) partition every
    continuation; ``nodes`` holds each expanded prefix. Build with :func:`target_law`.
    """

    prompt: tuple[int, ...]
    num_tokens: int
    params: SamplingParams
    processing: str
    min_prob: float
    stop_token_ids: tuple[int, ...]
    cells: list[Cell]
    probs: torch.Tensor
    nodes: dict[tuple[int, ...], Node]
    _index: dict[Cell, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._index = {cell: i for i, cell in enumerate(self.cells)}

    @property
    def num_cells(self) -> int:
        return len(self.cells)

    def cell_of(self, tokens: Sequence[int]) -> int:
        """Index of the cell a generated continuation falls in, or -1 when the target gives it
        probability 0 (a token filtered out, or a continuation that is too short). Tokens after
        the first m, or after a stop token, are ignored."""
        prefix: tuple[int, ...] = ()
        for token in list(tokens)[: self.num_tokens]:
            node = self.nodes.get(prefix)
            if node is None:  # cannot happen for a prefix of positive probability
                return -1
            token = int(token)
            if token < 0 or token >= node.zero.numel() or bool(node.zero[token]):
                return -1
            if token not in node.children:
                return self._index.get(Cell(prefix, lumped=True), -1)
            prefix = prefix + (token,)
            if token in self.stop_token_ids:
                break
        return self._index.get(Cell(prefix), -1)

    def position_labels(self, position: int) -> list[int]:
        """Token at ``position`` (0-based) of each cell: the token, OTHER when the cell was lumped
        at or before that position, ENDED when the continuation stopped earlier."""
        labels = []
        for cell in self.cells:
            if position < len(cell.tokens):
                labels.append(cell.tokens[position])
            elif cell.lumped:
                labels.append(OTHER)
            else:
                labels.append(ENDED)
        return labels

    def position_law(self, position: int) -> tuple[list[int], torch.Tensor]:
        """The exact marginal law of the token at ``position`` (0-based) on this law's cells:
        (labels, probs [L] float64)."""
        return _marginal(self.position_labels(position), self.probs)


def _marginal(labels: list[int], probs: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    keys = sorted(set(labels))
    where = {k: i for i, k in enumerate(keys)}
    out = torch.zeros(len(keys), dtype=torch.float64)
    out.index_add_(0, torch.tensor([where[k] for k in labels], dtype=torch.int64), probs)
    return keys, out


def transformers_processing(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities [N, V] float64 of logits [N, V] under transformers' warpers, in the order
    ``generate(do_sample=True)`` applies them (temperature, top-k, top-p, min-p); greedy params
    give the one-hot of the argmax."""
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    scores = logits.float()
    if params.is_greedy:
        return torch.nn.functional.one_hot(scores.argmax(dim=-1), scores.shape[-1]).double()
    warpers: list[Any] = []  # transformers' LogitsWarper objects
    if params.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k > 0:
        warpers.append(TopKLogitsWarper(top_k=params.top_k, min_tokens_to_keep=1))
    if params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=params.top_p, min_tokens_to_keep=1))
    if params.min_p > 0:
        warpers.append(MinPLogitsWarper(min_p=params.min_p, min_tokens_to_keep=1))
    for warp in warpers:
        scores = warp(None, scores)
    return torch.softmax(scores.double(), dim=-1)


def processed_probs(logits: torch.Tensor, params: SamplingParams, processing: str = "vllm") -> torch.Tensor:
    """Probabilities [N, V] float64 that an engine with ``processing`` samples from."""
    if processing == "vllm":
        return process_logits(logits.float(), params, backend="torch").double()
    if processing == "transformers":
        return transformers_processing(logits, params)
    raise input_error("processing", f"one of {PROCESSINGS}", repr(processing))


@torch.no_grad()
def _next_probs(
    model: torch.nn.Module, contexts: list[tuple[int, ...]], params: SamplingParams, processing: str, batch_size: int
) -> torch.Tensor:
    """Processed next-token probabilities [len(contexts), V] float64 (contexts of one length)."""
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(contexts), batch_size):
        ids = torch.tensor(contexts[start : start + batch_size], dtype=torch.int64, device=device)
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[:, -1]
        out.append(processed_probs(logits.float().cpu(), params, processing))
    return torch.cat(out)


def target_law(
    model: torch.nn.Module,
    prompt: Sequence[int],
    num_tokens: int,
    params: SamplingParams | None = None,
    processing: str = "vllm",
    min_prob: float = 0.0,
    stop_token_ids: Sequence[int] = (),
    batch_size: int = 256,
    max_nodes: int = 200_000,
) -> TargetLaw:
    """The exact law of the first ``num_tokens`` tokens ``model`` generates after ``prompt``.

    Args:
        model: a transformers causal LM (``model(input_ids).logits``), run in its own dtype; its
            logits are processed in fp32 (vLLM) or as transformers does.
        prompt: token ids.
        num_tokens: m >= 1.
        params: the request's SamplingParams (its seed is ignored); None: temperature 1.
        processing: "vllm" or "transformers" (the order of the filters; see the module docstring).
        min_prob: prefixes and children below this probability are lumped (0: every continuation
            is a cell; for large vocabularies use about 5 / N).
        stop_token_ids: tokens that end a continuation.
        batch_size: prefixes per forward.
        max_nodes: refuse laws that need more expanded prefixes than this.
    """
    if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens < 1:
        raise input_error("num_tokens", "an int >= 1", repr(num_tokens))
    if not isinstance(min_prob, (int, float)) or not 0.0 <= min_prob < 1.0:
        raise input_error("min_prob", "a number in [0, 1)", repr(min_prob))
    if processing not in PROCESSINGS:
        raise input_error("processing", f"one of {PROCESSINGS}", repr(processing))
    prompt_t = tuple(int(t) for t in prompt)
    if not prompt_t:
        raise input_error("prompt", "at least one token", "an empty prompt")
    params = params if params is not None else SamplingParams()
    stops = tuple(int(t) for t in stop_token_ids)
    nodes: dict[tuple[int, ...], Node] = {}
    cells: list[Cell] = []
    probs: list[float] = []
    frontier: list[tuple[tuple[int, ...], float]] = [((), 1.0)]  # prefixes to expand, with their mass
    for depth in range(num_tokens):
        if not frontier:
            break
        if len(nodes) + len(frontier) > max_nodes:
            raise input_error(
                "min_prob", f"a threshold that keeps the law under max_nodes={max_nodes} prefixes", repr(min_prob)
            )
        nxt = _next_probs(model, [prompt_t + p for p, _ in frontier], params, processing, batch_size)
        new_frontier: list[tuple[tuple[int, ...], float]] = []
        last = depth == num_tokens - 1
        for (prefix, mass), row in zip(frontier, nxt):
            row = row / row.sum()
            support = row > 0
            keep = support & (row * mass >= min_prob) if min_prob > 0 else support
            children = {t: float(row[t]) for t in keep.nonzero()[:, 0].tolist()}
            lumped = float(row[support & ~keep].sum())
            nodes[prefix] = Node(children, lumped, row == 0)
            if lumped > 0:
                cells.append(Cell(prefix, lumped=True))
                probs.append(lumped * mass)
            for t, p in children.items():
                child = prefix + (t,)
                if last or t in stops:
                    cells.append(Cell(child))
                    probs.append(p * mass)
                else:
                    new_frontier.append((child, p * mass))
        frontier = new_frontier
    probs_t = torch.tensor(probs, dtype=torch.float64)
    return TargetLaw(
        prompt_t, num_tokens, params, processing, float(min_prob), stops, cells, probs_t / probs_t.sum(), nodes
    )


@torch.no_grad()
def greedy_continuation(model: torch.nn.Module, prompt: Sequence[int], num_tokens: int) -> list[int]:
    """The target's own greedy continuation (argmax of fp32 logits, lowest id on ties): what a
    greedy request must get, token for token."""
    device = next(model.parameters()).device
    ids = [int(t) for t in prompt]
    for _ in range(num_tokens):
        x = torch.tensor([ids], dtype=torch.int64, device=device)
        logits = model(input_ids=x, attention_mask=torch.ones_like(x), use_cache=False).logits[0, -1]
        ids.append(int(logits.float().argmax()))
    return ids[len(prompt) :]


def target_laws(
    model: torch.nn.Module, prompts: Sequence[Sequence[int]], num_tokens: int, **kwargs: object
) -> list[TargetLaw]:
    """:func:`target_law` of each prompt (same keyword arguments)."""
    return [target_law(model, p, num_tokens, **kwargs) for p in prompts]  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# chi-square tails with torch only
# --------------------------------------------------------------------------------------------


def chi2_sf(x: float, df: float) -> float:
    """P(X >= x) for X ~ chi-square(df)."""
    if df <= 0:
        return 1.0
    if x <= 0:
        return 1.0
    a = torch.tensor(df / 2.0, dtype=torch.float64)
    return float(torch.special.gammaincc(a, torch.tensor(x / 2.0, dtype=torch.float64)))


def chi2_isf(p: float, df: float) -> float:
    """The x with P(X >= x) = p for X ~ chi-square(df) (bisection)."""
    lo, hi = 0.0, max(1.0, df)
    while chi2_sf(hi, df) > p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if chi2_sf(mid, df) > p:
            lo = mid
        else:
            hi = mid
    return hi


def ncx2_sf(x: float, df: float, noncentrality: float) -> float:
    """P(X >= x) for a noncentral chi-square (Patnaik's approximation: c * chi-square(h))."""
    k, lam = df, noncentrality
    c = (k + 2 * lam) / (k + lam)
    h = (k + lam) ** 2 / (k + 2 * lam)
    return chi2_sf(x / c, h)


# --------------------------------------------------------------------------------------------
# the test
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LawTest:
    """One test of samples against an exact law (the joint, or one position's marginal)."""

    name: str
    tv: float  # empirical TV distance on the test's cells (the N-weighted mean over prompts)
    tv_low: float  # confidence interval of the true TV at level 1 - alpha
    tv_high: float
    noise_tv: float  # the TV an exact engine shows on average at this N (its expectation under the law)
    chi2: float
    df: int
    p_value: float
    cells: int  # cells of positive probability, over all prompts
    threshold: float  # the p-value below which this test rejects

    @property
    def rejects(self) -> bool:
        return self.p_value < self.threshold

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "tv": self.tv,
            "tv_ci": [self.tv_low, self.tv_high],
            "noise_tv": self.noise_tv,
            "chi2": self.chi2,
            "df": self.df,
            "p_value": self.p_value,
            "cells": self.cells,
            "threshold": self.threshold,
            "rejects": self.rejects,
        }


@dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`check_samples`: ``consistent`` is False on evidence of loss."""

    consistent: bool
    alpha: float
    num_samples: int
    impossible: int  # samples the target gives probability 0
    impossible_examples: list[list[int]]
    joint: LawTest
    positions: list[LawTest]

    @property
    def tests(self) -> list[LawTest]:
        return [self.joint, *self.positions]

    def as_dict(self) -> dict[str, object]:
        return {
            "consistent": self.consistent,
            "alpha": self.alpha,
            "num_samples": self.num_samples,
            "impossible": self.impossible,
            "impossible_examples": self.impossible_examples,
            "joint": self.joint.as_dict(),
            "positions": [t.as_dict() for t in self.positions],
        }


def _pool(counts: torch.Tensor, probs: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Cells of expected count n p < MIN_EXPECTED pooled into one (which joins the smallest big
    cell when it is still too small): (counts [K'], probs [K'], the pooled probability mass)."""
    pos = probs > 0
    counts, probs = counts[pos], probs[pos]
    big = probs * n >= MIN_EXPECTED
    obs, law = counts[big], probs[big]
    small = float(probs[~big].sum())
    if small > 0:
        extra_obs, extra = counts[~big].sum()[None], probs[~big].sum()[None]
        if small * n >= MIN_EXPECTED or not law.numel():
            obs, law = torch.cat([obs, extra_obs]), torch.cat([law, extra])
        else:
            i = int(law.argmin())
            obs, law = obs.clone(), law.clone()
            obs[i] += extra_obs[0]
            law[i] += extra[0]
    return obs, law, small


def _chi2(counts: torch.Tensor, probs: torch.Tensor, n: int) -> tuple[float, int]:
    """Pearson's statistic and its degrees of freedom."""
    if counts.numel() < 2:
        return 0.0, 0
    expected = probs * n
    return float(((counts - expected) ** 2 / expected).sum()), counts.numel() - 1


def _tv_noise(probs: torch.Tensor, n: int) -> float:
    """E TV(p_hat, p) for n multinomial draws from probs: (1/2) sum_i E|Bin(n, p_i) / n - p_i|, each
    term by de Moivre's exact mean absolute deviation, or its normal limit sqrt(2 p (1-p) / (pi n))
    when n p (1-p) > 25."""
    total = 0.0
    for p in probs.tolist():
        if p <= 0 or p >= 1:
            continue
        var = p * (1 - p)
        if n * var > 25:
            total += math.sqrt(2 * var / (math.pi * n))
        else:  # de Moivre: E|X - n p| = 2 v C(n, v) p^v (1-p)^(n-v+1), v = floor(n p) + 1
            v = math.floor(n * p) + 1
            log_term = (
                math.lgamma(n + 1)
                - math.lgamma(v + 1)
                - math.lgamma(n - v + 1)
                + v * math.log(p)
                + (n - v + 1) * math.log1p(-p)
            )
            total += 2 * v * math.exp(log_term) / n if v <= n else 0.0
    return total / 2


def _one_test(name: str, groups: list[tuple[torch.Tensor, torch.Tensor]], alpha_ci: float, threshold: float) -> LawTest:
    """groups: per prompt, (counts [K], probs [K]) on that prompt's cells.

    The TV is measured on the pooled cells (those of the chi-square). It bounds the TV on the
    unpooled cells from below, and from above once the pooled mass P_s is added: pooling loses
    at most min(P_s, Q_s) of the distance (Q_s: the engine's mass on the pooled cells)."""
    n_total = sum(int(c.sum()) for c, _ in groups)
    chi2, df, tv, noise, cells, sqrt_k, pooled_mass = 0.0, 0, 0.0, 0.0, 0, 0.0, 0.0
    for counts, probs in groups:
        n = int(counts.sum())
        if n == 0:
            continue
        obs, law, small = _pool(counts, probs, n)
        stat, d = _chi2(obs, law, n)
        chi2 += stat
        df += d
        weight = n / n_total
        tv += weight * 0.5 * float((obs / n - law).abs().sum())
        noise += weight * _tv_noise(law, n)
        sqrt_k += weight * math.sqrt(obs.numel() / n)
        pooled_mass += weight * small
        cells += int((probs > 0).sum())
    # |TV_hat - TV| <= TV(p_hat, p_engine); E TV(p_hat, p_engine) <= sqrt(K / n) / 2 on K cells
    # (Cauchy-Schwarz), and TV(p_hat, p_engine) exceeds its mean by t with probability at most
    # exp(-2 N t^2) (McDiarmid, bounded differences 1/N).
    half = 0.5 * sqrt_k + math.sqrt(math.log(2 / alpha_ci) / (2 * max(n_total, 1)))
    p_value = chi2_sf(chi2, df) if df > 0 else 1.0
    return LawTest(
        name, tv, max(0.0, tv - half), min(1.0, tv + half + pooled_mass), noise, chi2, df, p_value, cells, threshold
    )


def check_samples(
    laws: Sequence[TargetLaw], samples: Sequence[Sequence[Sequence[int]]], alpha: float = 0.01
) -> Verdict:
    """Test generated continuations against the exact laws.

    Args:
        laws: one :class:`TargetLaw` per prompt (same ``num_tokens``).
        samples: per prompt, its generated continuations (token id lists; at least the first m
            tokens, fewer only when a stop token ended them).
        alpha: the false-failure rate of the verdict (an exact engine fails with probability at
            most alpha).
    """
    if not laws:
        raise input_error("laws", "at least one TargetLaw", "none")
    if len(samples) != len(laws):
        raise input_error("samples", f"one list of continuations per law ({len(laws)})", f"{len(samples)} lists")
    if not isinstance(alpha, float | int) or not 0 < alpha < 1:
        raise input_error("alpha", "a number in (0, 1)", repr(alpha))
    m = laws[0].num_tokens
    if any(law.num_tokens != m for law in laws):
        raise input_error("laws", f"laws of the same num_tokens ({m})", [law.num_tokens for law in laws])
    threshold = alpha / (m + 1)  # Bonferroni over the joint and the m positions
    impossible = 0
    examples: list[list[int]] = []
    joint_groups: list[tuple[torch.Tensor, torch.Tensor]] = []
    position_groups: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(m)]
    for law, rows in zip(laws, samples):
        index = [law.cell_of(row) for row in rows]
        bad = [list(map(int, row[:m])) for row, i in zip(rows, index) if i < 0]
        impossible += len(bad)
        examples += bad[: max(0, 5 - len(examples))]
        good = torch.tensor([i for i in index if i >= 0], dtype=torch.int64)
        counts = torch.bincount(good, minlength=law.num_cells).double()
        joint_groups.append((counts, law.probs))
        for j in range(m):
            labels = law.position_labels(j)
            keys, probs = _marginal(labels, law.probs)
            where = {k: i for i, k in enumerate(keys)}
            label_index = torch.tensor([where[k] for k in labels], dtype=torch.int64)
            pos_counts = torch.zeros(len(keys), dtype=torch.float64).index_add_(0, label_index, counts)
            position_groups[j].append((pos_counts, probs))
    n = sum(len(rows) for rows in samples)
    joint = _one_test(f"joint (tokens 1-{m})", joint_groups, alpha, threshold)
    positions = [_one_test(f"token {j + 1}", position_groups[j], alpha, threshold) for j in range(m)]
    consistent = impossible == 0 and not any(t.rejects for t in [joint, *positions])
    return Verdict(consistent, float(alpha), n, impossible, examples, joint, positions)


def samples_needed(
    laws: Sequence[TargetLaw],
    detectable_tv: float = 0.1,
    alpha: float = 0.01,
    power: float = 0.95,
    max_samples: int = 10_000_000,
) -> int:
    """The total N (split evenly over the prompts) at which the joint chi-square test of
    :func:`check_samples` detects, with probability ``power``, an engine whose joint law is at
    TV distance ``detectable_tv`` or more from the target's on every prompt.

    Pooling the cells of expected count below 5 (mass P_s) keeps at least d - P_s of a distance d;
    on the pooled cells an engine at distance d' has noncentrality lambda >= 4 n d'^2 per prompt
    (Cauchy-Schwarz: (sum |delta|)^2 <= sum delta^2 / p). The power is read from the noncentral
    chi-square (Patnaik's approximation) at the pooled degrees of freedom that n gives.
    """
    if not 0 < detectable_tv <= 1:
        raise input_error("detectable_tv", "a number in (0, 1]", repr(detectable_tv))
    if not 0 < power < 1:
        raise input_error("power", "a number in (0, 1)", repr(power))
    m = laws[0].num_tokens
    threshold = alpha / (m + 1)

    def detects(n_per_prompt: int) -> bool:
        df, lam = 0, 0.0
        for law in laws:
            _, pooled, small = _pool(law.probs, law.probs, n_per_prompt)
            df += max(pooled.numel() - 1, 1)
            # pooling keeps at least d - (pooled mass) of a distance d
            lam += 4 * n_per_prompt * max(detectable_tv - small, 0.0) ** 2
        return lam > 0 and ncx2_sf(chi2_isf(threshold, df), df, lam) >= power

    lo, hi = 1, 16
    while not detects(hi):
        lo, hi = hi, hi * 2
        if hi * len(laws) > max_samples:
            raise input_error("detectable_tv", f"a TV detectable with at most {max_samples} samples", detectable_tv)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if detects(mid) else (mid, hi)
    return hi * len(laws)


def counts_of(rows: Sequence[Sequence[int]], m: int) -> Counter[tuple[int, ...]]:
    """How often each continuation (its first m tokens) occurs: for reports."""
    return Counter(tuple(int(t) for t in row[:m]) for row in rows)
