"""Exact output laws of multi-path verifiers by enumeration (float64), shared by the GBV and HSD
tests and the acceptance benchmark.

A toy model gives q(.|prefix) and p(.|prefix) for every prefix (context dependent, with ties of
the key min(1, q/p): below the cap by construction, at the cap whenever q >= p). Every draft
outcome of K independent paths of length L is enumerated with its probability; the verifier's
law given the drafts comes from :func:`spec_samplers.tree.multipath.multipath_plan` (the code the
sampler runs, in float64); each emitted prefix is completed by the target's conditionals, so a
lossless verifier's completed law is the target's joint law over V^(L+1) sequences.
"""

from __future__ import annotations

import itertools
import math

import torch

from spec_samplers.layout import TreeBatch, node_depths, padded_maps
from spec_samplers.tree.multipath import MultipathPlan, multipath_plan, path_parents


def _dist(gen: torch.Generator, V: int, tie: bool) -> torch.Tensor:
    d = torch.softmax(torch.randn(V, generator=gen, dtype=torch.float64) * 1.2, -1)
    if tie and V >= 3:  # tokens 1 and 2 share one value: with another shared value in the other
        d[1] = d[2] = (d[1] + d[2]) / 2  # row, their keys tie below the cap
    return d


class ToyPair:
    """q and p for every prefix of length <= L (p below L), context dependent; ``ties``: every
    row gives tokens 1 and 2 equal probability (equal keys at every node)."""

    def __init__(self, V: int, L: int, seed: int, ties: bool = True, distance: float = 1.0):
        gen = torch.Generator().manual_seed(seed)
        self.V, self.L = V, L
        self.q: dict[tuple[int, ...], torch.Tensor] = {}
        self.p: dict[tuple[int, ...], torch.Tensor] = {}
        for length in range(L + 1):
            for prefix in itertools.product(range(V), repeat=length):
                q = _dist(gen, V, ties)
                self.q[prefix] = q
                if length < L:
                    noise = torch.randn(V, generator=gen, dtype=torch.float64) * distance
                    if ties and V >= 3:
                        noise[2] = noise[1]
                    p = torch.softmax(q.log() + noise, -1)
                    self.p[prefix] = p

    def joint_target(self) -> torch.Tensor:
        """[V^(L+1)] the target's law of whole sequences (row-major cells)."""
        out = torch.empty(self.V ** (self.L + 1), dtype=torch.float64)
        for cell, seq in enumerate(itertools.product(range(self.V), repeat=self.L + 1)):
            out[cell] = math.prod(float(self.q[seq[:i]][seq[i]]) for i in range(self.L + 1))
        return out

    def path_prob(self, path: tuple[int, ...]) -> float:
        return math.prod(float(self.p[path[:i]][path[i]]) for i in range(len(path)))

    def batch(self, K: int) -> tuple[TreeBatch, torch.Tensor]:
        """Every draft of K paths as one batch (float64 rows) and each draft's probability [B]."""
        V, L = self.V, self.L
        paths = list(itertools.product(range(V), repeat=L))
        combos = list(itertools.product(range(len(paths)), repeat=K))
        B, N = len(combos), K * L
        tokens = torch.empty(B, N, dtype=torch.int64)
        target = torch.empty(B, N + 1, V, dtype=torch.float64)
        draft = torch.empty(B, N + 1, V, dtype=torch.float64)
        prob = torch.empty(B, dtype=torch.float64)
        for b, combo in enumerate(combos):
            target[b, 0], draft[b, 0] = self.q[()], self.p[()]
            pr = 1.0
            for i, c in enumerate(combo):
                path = paths[c]
                pr *= self.path_prob(path)
                for d in range(1, L + 1):
                    tokens[b, i * L + d - 1] = path[d - 1]
                    target[b, i * L + d] = self.q[path[:d]]
                    draft[b, i * L + d] = self.p[path[:d]] if d < L else self.q[path[:d]]
            prob[b] = pr
        parents = torch.tensor(path_parents(K, L), dtype=torch.int64)[None, :].expand(B, N)
        tb = TreeBatch(
            target=target.reshape(-1, V), draft=draft.reshape(-1, V), target_rows=padded_maps(B, N, "cpu"),
            draft_rows=padded_maps(B, N, "cpu"), tokens=tokens, parents=parents, depth=node_depths(parents),
            max_depth=L, policy="independent", seeds=None, offsets=None, is_greedy=None,
        )  # fmt: skip
        return tb, prob

    def completed_law(self, tb: TreeBatch, prob: torch.Tensor, plan: MultipathPlan) -> torch.Tensor:
        """[V^(L+1)] the law of the verifier's output completed by the target (see module doc)."""
        return completed_law(self, tb.tokens, prob, plan)


def tau_law(thresholds: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """[B, L+1] P(tau = m) = h_m prod_{m < m' <= L'} (1 - h_m') with independent uniforms."""
    B, L = thresholds.shape
    m = torch.arange(1, L + 1)[None, :]
    h = torch.where(m <= length[:, None], thresholds, 0.0)
    out = torch.zeros(B, L + 1, dtype=torch.float64)
    fail_after = torch.ones(B, dtype=torch.float64)  # prod over m' > m of (1 - h_m')
    for mm in range(L, 0, -1):
        out[:, mm] = h[:, mm - 1] * fail_after
        fail_after = fail_after * (1.0 - h[:, mm - 1])
    out[:, 0] = fail_after
    return out


def completed_law(pair: ToyPair, tokens: torch.Tensor, prob: torch.Tensor, plan: MultipathPlan) -> torch.Tensor:
    V, L = pair.V, pair.L
    B = tokens.shape[0]
    p_tau = tau_law(plan.thresholds.double(), plan.length)
    resid = plan.residuals.double()
    resid = resid / resid.sum(-1, keepdim=True).clamp_min(1e-300)
    path = plan.path.clamp(min=0)
    picked = torch.stack([tokens[torch.arange(B), path * L + d] for d in range(L)], dim=1) if L else tokens[:, :0]
    law = torch.zeros(V ** (L + 1), dtype=torch.float64)
    for cell, seq in enumerate(itertools.product(range(V), repeat=L + 1)):
        total = torch.zeros(B, dtype=torch.float64)
        for m in range(L + 1):
            match = (picked[:, :m] == torch.tensor(seq[:m])).all(dim=1) if m else torch.ones(B, dtype=torch.bool)
            rest = math.prod(float(pair.q[seq[:i]][seq[i]]) for i in range(m + 1, L + 1))
            total += torch.where(match, p_tau[:, m] * resid[:, m, seq[m]], 0.0) * rest
        law[cell] = float((prob * total).sum())
    return law


def gbv_law(pair: ToyPair, K: int, **plan_options: object) -> tuple[torch.Tensor, float]:
    """(completed output law, expected accepted tokens) of GBV with K paths on ``pair``."""
    tb, prob = pair.batch(K)
    plan = multipath_plan(tb, K, dtype=torch.float64, **plan_options)  # type: ignore[arg-type]
    law = pair.completed_law(tb, prob, plan)
    p_tau = tau_law(plan.thresholds.double(), plan.length)
    accepted = float((prob[:, None] * p_tau * torch.arange(pair.L + 1)).sum())
    return law, accepted


def sample_paths(pair: ToyPair, K: int, B: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """B requests of K paths drawn from the pair's draft: (target [B, N+1, V], draft [B, N+1, V]
    fp32 rows of each node's prefix, tokens [B, N])."""
    V, L = pair.V, pair.L
    N = K * L
    tokens = torch.empty(B, N, dtype=torch.int64)
    for i in range(K):
        for d in range(L):
            prefixes = tokens[:, i * L : i * L + d].tolist()
            probs = torch.stack([pair.p[tuple(x)] for x in prefixes])
            tokens[:, i * L + d] = torch.multinomial(probs, 1, generator=gen)[:, 0]
    target = torch.empty(B, N + 1, V, dtype=torch.float64)
    draft = torch.empty(B, N + 1, V, dtype=torch.float64)
    for b, row in enumerate(tokens.tolist()):
        target[b, 0], draft[b, 0] = pair.q[()], pair.p[()]
        for i in range(K):
            for d in range(1, L + 1):
                prefix = tuple(row[i * L : i * L + d])
                target[b, i * L + d] = pair.q[prefix]
                draft[b, i * L + d] = pair.p.get(prefix, pair.q[prefix])
    return target.float(), draft.float(), tokens


def complete(pair: ToyPair, out: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """[B] cells of the outputs [B, L+1] with the -1 slots filled by fresh target samples."""
    seq = out.clone()
    for i in range(pair.L + 1):
        missing = seq[:, i] == -1
        if bool(missing.any()):
            probs = torch.stack([pair.q[tuple(x[:i])] for x in seq[missing].tolist()])
            seq[missing, i] = torch.multinomial(probs, 1, generator=gen)[:, 0]
    weights = pair.V ** torch.arange(pair.L, -1, -1)
    return (seq * weights).sum(dim=1)


def hsd_law(pair: ToyPair, capped: bool = True) -> tuple[torch.Tensor, float]:
    """(completed output law, expected accepted tokens) of HSD on one draft path, written in the
    paper's terms (joint probabilities, not block verification's code): with P_m, Q_m the target
    and draft probabilities of the draft prefix of length m, the capped prefix mass
    P'_m = P_m / max(1, max_{j<=m} P_j / Q_j), the branch masses at position m
    d = P'_m q_m - Q_m p_m, the kept mass sum d+ / max(sum d+, sum d-) (the probability of not
    stepping back at m), the stop position the last m < L that does not step back, the token
    there a draw of d+ normalised; the whole draft is accepted with probability min(1, P'_L / Q_L)
    (Algorithm 2; ``capped=False``: the released code's min(1, P_L / Q_L)), then a draw of q_L."""
    V, L = pair.V, pair.L
    law = torch.zeros(V ** (L + 1), dtype=torch.float64)
    accepted = 0.0
    weights = V ** torch.arange(L, -1, -1)
    for x in itertools.product(range(V), repeat=L):
        draft_prob = pair.path_prob(x)
        if draft_prob == 0.0:
            continue
        big_p, big_q, best = [1.0], [1.0], 1.0
        for m in range(L):
            big_p.append(big_p[-1] * float(pair.q[x[:m]][x[m]]))
            big_q.append(big_q[-1] * float(pair.p[x[:m]][x[m]]))
        keep, resid = [], []
        for m in range(L):
            best = max(best, big_p[m] / big_q[m])
            d = (big_p[m] / best) * pair.q[x[:m]] - big_q[m] * pair.p[x[:m]]
            plus, minus = float(d.clamp_min(0).sum()), float((-d).clamp_min(0).sum())
            keep.append(plus / max(plus, minus) if max(plus, minus) > 0 else 1.0)
            resid.append(d.clamp_min(0) / plus if plus > 0 else pair.q[x[:m]])
        full = big_p[L] / (max(best, big_p[L] / big_q[L]) if capped else 1.0) / big_q[L]
        stop_law = [0.0] * (L + 1)
        stop_law[L] = min(1.0, full)
        none_after = 1.0 - stop_law[L]
        for m in range(L - 1, -1, -1):
            stop_law[m] = none_after * keep[m] if m else none_after  # position 0 always keeps
            none_after *= 1.0 - keep[m]
        for m in range(L + 1):
            emit = resid[m] if m < L else pair.q[x]
            for y in range(V):
                prefix = (*x[:m], y)
                mass = draft_prob * stop_law[m] * float(emit[y])
                if mass == 0.0:
                    continue
                for rest in itertools.product(range(V), repeat=L - m):
                    seq = prefix + rest
                    cont = math.prod(float(pair.q[seq[:i]][seq[i]]) for i in range(m + 1, L + 1))
                    law[int((torch.tensor(seq) * weights).sum())] += mass * cont
            accepted += draft_prob * stop_law[m] * m
    return law, accepted
