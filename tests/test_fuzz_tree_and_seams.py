"""Contract fuzz, continued (tests/test_fuzz_contract.py covers the chain entries): the tree entries
and the vLLM engine seams, on both backends, with malformed inputs.

Tree entries (``forward_tree*``, every sampler): random trees, then bent: parents pointing forward,
at themselves (cycles), negative or huge; tokens out of range; ragged ``cu_num_nodes`` that
disagree with the rows (non-monotone, past T, negative) or ``max_nodes`` too small; NaN rows;
edge temperatures; strict mode. vLLM seams (``v1_runner.verify``, ``v2_runner.verify``):
non-monotone or out-of-range ``cu_num_draft_tokens`` / ``cu_num_logits``, a request without its
bonus row, unknown request states, out-of-range ids and bonus ids, empty batches, short row tensors.

A violation is an exception other than a ValueError whose message starts with the argument it is
about; a malformed request that emits a token; an emitted token the target gives probability 0,
outside [0, V), or not the draft at an accepted position; a tree path that does not follow the
(cleaned) parents; the two backends answering differently. Fixed seeds; the Triton kernels run
through the interpreter on the CPU.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from test_fuzz_contract import SEED, judge_error

from spec_samplers import BlockVerificationSampler, RejectionSampler, TypicalAcceptanceSampler
from spec_samplers.integrations.vllm import v1_runner, v2_runner
from spec_samplers.integrations.vllm.ragged import RaggedVerifier
from spec_samplers.torch_ops import clean_probs, probs_from_logits

SAMPLERS = {"rejection": RejectionSampler, "typical": TypicalAcceptanceSampler, "block": BlockVerificationSampler}
TREE_ENTRIES = ("forward_tree", "forward_tree_ragged", "forward_tree_from_logits", "forward_tree_ragged_from_logits")
#: arguments of the tree entries and the seams a ValueError may name (in addition to the chain's)
TREE_ARGUMENTS = {"parents", "cu_num_nodes", "max_nodes", "max_depth", "draft_sampling", "cu_num_logits"}
TREE_ARGUMENTS |= {"idx_mapping", "seed", "pos", "draft_sampled", "expanded_idx_mapping", "expanded_local_pos"}
INF, NAN = float("inf"), float("nan")


def judge(e: Exception) -> str | None:
    name = str(e).split(":", 1)[0]
    if isinstance(e, ValueError) and name in TREE_ARGUMENTS:
        return None
    return judge_error(e)


def tree_case(rng: random.Random, gen: torch.Generator) -> dict:
    sampler = rng.choice(list(SAMPLERS))
    entry = rng.choice(TREE_ENTRIES)
    ragged, logits = "ragged" in entry, "logits" in entry
    B, N, V = rng.randint(0, 3), rng.randint(0, 4), rng.choice([1, 2, 5, 17])
    parents = [[rng.randrange(j) for j in range(1, N + 1)] for _ in range(B)]  # node j's parent in [0, j)
    bad_parents = B and N and rng.random() < 0.5
    if bad_parents:
        b, j = rng.randrange(B), rng.randrange(N)
        parents[b][j] = rng.choice([j + 1, j + 2, N + 3, -1, -(2**40), 2**40])  # itself (a cycle), forward, ...
    counts = [rng.randint(0, N) for _ in range(B)]  # ragged: N_b nodes each
    x = torch.randn(B, N + 1, V, generator=gen) * rng.choice([0.5, 3.0])
    target = x if logits else torch.softmax(x, -1)
    draft = (x + torch.randn(B, N + 1, V, generator=gen)) if logits else torch.softmax(x, -1).roll(1, -1)
    if B and rng.random() < 0.3:
        target[rng.randrange(B), rng.randrange(N + 1)] = rng.choice([NAN, -INF if logits else 0.0])
    if rng.random() < 0.2 or sampler == "typical":
        draft = None
    tokens = torch.randint(0, V, (B, N), generator=gen)
    if tokens.numel() and rng.random() < 0.3:
        tokens.view(-1)[rng.randrange(tokens.numel())] = rng.choice([-1, V, 2**40])
    policy = rng.choice(["independent", "without_replacement", "deterministic"])
    par_t = torch.tensor(parents, dtype=torch.int64).reshape(B, N)
    kwargs: dict = {}
    if ragged:
        rows = torch.cat([target[b, : counts[b] + 1] for b in range(B)]) if B else target.reshape(0, V)
        d_rows = None if draft is None else torch.cat([draft[b, : counts[b] + 1] for b in range(B)]) if B else None
        flat_tok = torch.cat([tokens[b, : counts[b]] for b in range(B)]) if B else tokens.reshape(0)
        flat_par = torch.cat([par_t[b, : counts[b]] for b in range(B)]) if B else par_t.reshape(0)
        cu = torch.tensor(counts, dtype=torch.int64).cumsum(0)
        max_nodes = N
        if B and rng.random() < 0.3:
            b = rng.randrange(B)
            bad = rng.choice(["non_monotone", "past_T", "negative", "max_nodes"])
            if bad == "non_monotone":
                cu[b] -= rng.randint(1, 3)
            elif bad == "past_T":
                cu[b] += rng.randint(1, 3)
            elif bad == "negative":
                cu[b] = -rng.randint(1, 5)
            else:
                max_nodes = max(max(counts) - 1, 0)
        args: list = [rows, d_rows, flat_tok, flat_par, cu, max_nodes]
        per_request = [
            dict(n=n, parents=flat_par[s : s + n], tokens=flat_tok[s : s + n], rows=rows[s + b : s + b + n + 1])
            for b, (s, n) in enumerate(_spans(cu.tolist(), flat_tok.shape[0], max_nodes))
        ]
    else:
        shared = B and not bad_parents and all(p == parents[0] for p in parents) and rng.random() < 0.5
        args = [target, draft, tokens, parents[0] if shared else par_t]
        per_request = [dict(n=N, parents=par_t[b], tokens=tokens[b], rows=target[b]) for b in range(B)]
    if logits:
        temps = [rng.choice([0.0, 0.5, 1.0, 2.0, INF, -1.0, NAN]) for _ in range(B)]
        args.append(torch.tensor(temps, dtype=torch.float32))
        kwargs["draft_sampling"] = policy
    else:
        args.append(policy)
    if sampler != "typical":
        kwargs["seeds"] = torch.randint(0, 2**40, (B,), generator=gen)
        if not logits and rng.random() < 0.3:
            kwargs["is_greedy"] = torch.rand(B, generator=gen) < 0.5
    options = dict(strict_mode=rng.random() < 0.2)
    return dict(
        sampler=sampler, entry=entry, args=args, kwargs=kwargs, options=options, B=B, N=N, V=V,
        ragged=ragged, logits=logits, requests=per_request,
    )  # fmt: skip


def _spans(cu: list[int], T: int, max_nodes: int) -> list[tuple[int, int]]:
    """(start, N_b) per request, N_b -1 when malformed (docs/contract.md, "Robustness")."""
    out = []
    for b, end in enumerate(cu):
        start = cu[b - 1] if b else 0
        ok = 0 <= start <= end <= T and end - start <= max_nodes
        out.append((start, end - start if ok else -1))
    return out


def run(case: dict, backend: str, entry: str | None = None):
    sampler = SAMPLERS[case["sampler"]](backend=backend, **case["options"])
    try:
        return getattr(sampler, entry or case["entry"])(*case["args"], **case["kwargs"])
    except Exception as e:  # judged by the caller
        return e


def q_row(case: dict, b: int, node: int) -> torch.Tensor:
    """The target law at node ``node`` of request b (what the entry verifies against)."""
    row = case["requests"][b]["rows"][node]
    if case["logits"]:
        return probs_from_logits(row[None], case["args"][-1][b : b + 1])[0]
    return clean_probs(row)


def tree_violations(case: dict, out) -> list[str]:
    B, V = case["B"], case["V"]
    tok, nodes = out.token_ids, out.node_ids
    if tok.dtype != torch.int64 or nodes.dtype != torch.int64 or tok.shape[0] != B or nodes.shape[0] != B:
        return [f"output {tok.dtype} {tuple(tok.shape)} / {nodes.dtype} {tuple(nodes.shape)}, B = {B}"]
    if tok.shape[1] != nodes.shape[1] + 1:
        return [f"token_ids {tuple(tok.shape)} and node_ids {tuple(nodes.shape)}: D+1 and D"]
    found = []
    for b in range(B):
        req = case["requests"][b]
        n_b = req["n"]
        row, path = tok[b].tolist(), nodes[b].tolist()
        emitted = next((i for i, t in enumerate(row) if t == -1), len(row))
        depth = next((i for i, t in enumerate(path) if t == -1), len(path))
        if any(t != -1 for t in row[emitted:]) or any(t != -1 for t in path[depth:]):
            found.append(f"request {b}: -1 before a token: {row} {path}")
            continue
        if n_b < 0:
            if emitted:
                found.append(f"request {b}: malformed ragged request emitted {row}")
            continue
        if emitted not in (depth, depth + 1):
            found.append(f"request {b}: {emitted} tokens for a path of {depth} nodes: {row} {path}")
            continue
        parent = 0
        for d in range(depth):
            node = path[d]
            par = int(req["parents"][node - 1]) if 1 <= node <= n_b else None
            if par != parent or not 0 <= parent < node:  # a parent outside [0, j) detaches node j
                found.append(f"request {b}: node {node} at depth {d} is not a child of {parent}: {path}")
                break
            if row[d] != int(req["tokens"][node - 1]) or not 0 <= row[d] < V:
                found.append(f"request {b}: token {row[d]} at depth {d}, node {node}'s is {req['tokens'][node - 1]}")
                break
            if not float(q_row(case, b, parent)[row[d]]) > 0:
                found.append(f"request {b}: accepted token {row[d]} has target probability 0")
            parent = node
        if emitted == depth + 1:
            t = row[depth]
            if not 0 <= t < V or not float(q_row(case, b, parent)[t]) > 0:
                found.append(f"request {b}: final token {t} outside [0, {V}) or of target probability 0")
    return found


def test_fuzz_tree_entries():
    rng = random.Random(SEED + 1)
    gen = torch.Generator().manual_seed(SEED + 1)
    problems, stats = [], {"ok": 0, "error": 0}
    for n in range(40):
        case = tree_case(rng, gen)
        where = f"case {n} ({case['sampler']}.{case['entry']}, B={case['B']} N={case['N']} V={case['V']})"
        results = [run(case, backend) for backend in ("torch", "triton")]
        for backend, res in zip(("torch", "triton"), results):
            if isinstance(res, Exception):
                bad = judge(res)
                problems += [f"{where} {backend}: {bad}"] if bad else []
            else:
                problems += [f"{where} {backend}: {v}" for v in tree_violations(case, res)]
        a, b = results
        if isinstance(a, Exception) or isinstance(b, Exception):
            stats["error"] += 1
            if str(a) != str(b):
                problems.append(f"{where}: backends differ: torch {a!r:.150} / triton {b!r:.150}")
        else:
            stats["ok"] += 1
            if not (torch.equal(a.token_ids, b.token_ids) and torch.equal(a.node_ids, b.node_ids)):
                problems.append(f"{where}: backends disagree:\n{a}\n{b}")
    assert problems == [], "\n".join(problems)
    assert stats["ok"] >= 15 and stats["error"] >= 2, stats


# --- the vLLM seams (plain functions: no vLLM needed) -----------------------------------------


def _logits_with_mass(L: int, V: int, gen: torch.Generator) -> torch.Tensor:
    """vLLM's processed logits: -inf where top-k / top-p masked, every row with mass."""
    x = torch.randn(L, V, generator=gen) * 3
    x[torch.rand(L, V, generator=gen) < 0.3] = -INF
    if L:
        x[torch.arange(L), torch.randint(0, V, (L,), generator=gen)] = 1.0
    return x


def _row_violations(row: list[int], V: int, finite: list[torch.Tensor], drafts: list[int], bonus: int | None) -> str:
    """One well-formed request's output: accepted drafts, then one token of a row with mass."""
    emitted = next((i for i, t in enumerate(row) if t == -1), len(row))
    if any(t != -1 for t in row[emitted:]):
        return f"-1 before a token: {row}"
    for j, t in enumerate(row[:emitted]):
        if not 0 <= t < V:
            return f"token outside [0, {V}): {row}"
        if j < len(finite):
            if not bool(finite[j][t]):
                return f"token {t} at {j} has target probability 0: {row}"
            if j < emitted - 1 and t != drafts[j]:
                return f"position {j} holds {t}, not the accepted draft {drafts[j]}: {row}"
        elif j == len(finite) and bonus is not None and t != bonus:
            return f"bonus slot {t}, bonus id {bonus}: {row}"
    return ""


def v1_case(rng: random.Random, gen: torch.Generator) -> dict:
    B, K, V = rng.randint(0, 3), rng.randint(0, 3), rng.choice([1, 5, 17])
    counts = [rng.randint(0, K) for _ in range(B)]
    T = sum(counts)
    cu = torch.tensor(counts, dtype=torch.int64).cumsum(0)
    logits, ids = _logits_with_mass(T, V, gen), torch.randint(0, V, (T,), generator=gen)
    bonus = torch.randint(0, V, (B, 1), generator=gen)
    bad = rng.choice(["none", "non_monotone", "past_T", "negative", "ids", "bonus", "rows"])
    if B and bad == "non_monotone":
        cu[rng.randrange(B)] -= rng.randint(1, 3)
    elif B and bad == "past_T":
        cu[rng.randrange(B)] += rng.randint(1, 3)
    elif B and bad == "negative":
        cu[rng.randrange(B)] = -2
    elif T and bad == "ids":
        ids[rng.randrange(T)] = rng.choice([-1, V, 2**40])
    elif B and bad == "bonus":
        bonus[rng.randrange(B)] = rng.choice([-1, V])
    elif bad == "rows":
        logits = logits[: max(T - 1, 0)]
    mode = rng.choice(["greedy", "random", "mixed"])
    temp = torch.tensor([rng.choice([0.0, 1.0]) for _ in range(B)])
    meta = SimpleNamespace(all_greedy=mode == "greedy", all_random=mode == "random", temperature=temp, generators={})
    return dict(B=B, K=K, V=V, args=(ids, counts, K, cu, None, logits, bonus, meta))


def v1_violations(case: dict, out: torch.Tensor) -> list[str]:
    ids, _, K, cu, _, logits, bonus, _ = case["args"]
    B, V = case["B"], case["V"]
    if out.dtype != torch.int32 or tuple(out.shape) != (B, K + 1):
        return [f"output {out.dtype} {tuple(out.shape)}, expected int32 {(B, K + 1)}"]
    found = []
    rows = min(logits.shape[0], ids.shape[0])
    for b, (start, n) in enumerate(_spans(cu.tolist(), rows, K)):
        row = out[b].tolist()
        if n < 0:
            if row[0] != -1:
                found.append(f"request {b}: malformed request emitted {row}")
            continue
        finite = [torch.isfinite(logits[start + j]) for j in range(n)]
        ok_bonus = int(bonus[b]) if 0 <= int(bonus[b]) < V else None
        if ok_bonus is None and row[n:] != [-1] * (K + 1 - n):
            found.append(f"request {b}: out-of-range bonus id {int(bonus[b])} emitted {row}")
        why = _row_violations(row, V, finite, ids[start : start + n].tolist(), ok_bonus)
        found += [f"request {b}: {why}"] if why else []
    return found


def v2_case(rng: random.Random, gen: torch.Generator) -> dict:
    R, S, V = rng.randint(0, 3), rng.randint(1, 3), rng.choice([1, 5, 17])
    states = rng.sample(range(R + 2), R)
    counts = [rng.randint(1, S + 1) for _ in range(R)]  # drafts + the bonus row
    L = sum(counts)
    cu = torch.zeros(R + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(counts, dtype=torch.int32).cumsum(0)
    idx = torch.tensor(states, dtype=torch.int32)
    inputs = dict(
        draft_sampled=torch.randint(0, V, (L,), generator=gen).int(),
        pos=torch.randint(0, 100, (L,), generator=gen),
        expanded_idx_mapping=torch.tensor(sum(([s] * c for s, c in zip(states, counts)), []), dtype=torch.int32),
        expanded_local_pos=torch.tensor(sum((list(range(c)) for c in counts), []), dtype=torch.int32),
    )
    bad = rng.choice(["none", "non_monotone", "first", "end", "state", "bonus_row", "ids", "short"])
    if R and bad == "non_monotone":
        cu[rng.randint(1, R)] -= rng.randint(1, 3)
    elif bad == "first":
        cu[0] = rng.choice([1, -1])
    elif R and bad == "end":
        cu[R] += rng.choice([1, -1])
    elif R and bad == "state":
        idx[rng.randrange(R)] = rng.choice([R + 2, -1, 2**30])
    elif R and bad == "bonus_row":  # request r lost its rows, bonus row included
        r = rng.randrange(R)
        cu[r + 1 :] -= counts[r]
    elif L and bad == "ids":
        inputs["draft_sampled"][rng.randrange(L)] = rng.choice([-1, V, 2**30])
    elif bad == "short":
        name = rng.choice(list(inputs))
        inputs[name] = inputs[name][: max(L - 1, 0)]
    logits = _logits_with_mass(L, V, gen)
    temperature = torch.tensor([rng.choice([0.0, 1.0, 0.7]) for _ in range(R + 2)])
    seed = torch.randint(0, 2**40, (R + 2,), generator=gen)
    args = (
        logits, None, inputs["draft_sampled"], cu, inputs["pos"], idx, inputs["expanded_idx_mapping"],
        inputs["expanded_local_pos"], temperature, seed, S,
    )  # fmt: skip
    return dict(R=R, S=S, V=V, L=L, args=args)


def v2_violations(case: dict, res: tuple[torch.Tensor, torch.Tensor]) -> list[str]:
    out, num_sampled = res
    logits, _, sampled, cu, _, idx, _, _, temperature, _, S = case["args"]
    R, V, L = case["R"], case["V"], case["L"]
    if tuple(out.shape) != (R, S + 1) or tuple(num_sampled.shape) != (R,):
        return [f"output {tuple(out.shape)} / {tuple(num_sampled.shape)}, expected {(R, S + 1)} / {(R,)}"]
    found, cl = [], cu.tolist()
    for r in range(R):
        row = out[r].tolist()
        s, e = cl[r], cl[r + 1]
        if int(num_sampled[r]) != sum(t != -1 for t in row):
            found.append(f"request {r}: num_sampled {int(num_sampled[r])} for {row}")
        ok = (r > 0 or s == 0) and 0 <= s < e <= L and e - s <= S + 1 and max(cl[: r + 1]) == s
        if not ok or not 0 <= int(idx[r]) < temperature.shape[0]:
            if row[0] != -1:
                found.append(f"request {r}: malformed request emitted {row}")
            continue
        finite = [torch.isfinite(logits[i]) for i in range(s, e)]  # the bonus row last
        why = _row_violations(row, V, finite, sampled[s + 1 : e].tolist(), None)
        found += [f"request {r}: {why}"] if why else []
    return found


@pytest.mark.parametrize("seam", ["v1", "v2"])
def test_fuzz_vllm_seams(seam):
    rng = random.Random(SEED + 2)
    gen = torch.Generator().manual_seed(SEED + 2)
    make, violations, verify = {
        "v1": (v1_case, v1_violations, v1_runner.verify),
        "v2": (v2_case, v2_violations, v2_runner.verify),
    }[seam]
    problems, stats = [], {"ok": 0, "error": 0}
    for n in range(60):
        case = make(rng, gen)
        name = rng.choice(list(SAMPLERS))
        where = f"case {n} ({seam}, {name}, {case['V']=})"
        for backend in ("torch", "triton"):
            try:
                res = verify(RaggedVerifier(SAMPLERS[name](backend=backend)), *case["args"])
            except Exception as e:
                stats["error"] += 1
                bad = judge(e)
                problems += [f"{where} {backend}: {bad}"] if bad else []
                continue
            stats["ok"] += 1
            problems += [f"{where} {backend}: {v}" for v in violations(case, res)]
    assert problems == [], "\n".join(problems)
    assert stats["ok"] >= 60, stats
