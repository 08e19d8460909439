"""Contract fuzz: random adversarial calls of both samplers, all four entries, both backends.

Each case draws a sampler, an entry, tiny shapes (B <= 3, K <= 3, V <= 40), a dtype, strict mode
and check_values on or off, and then bends the inputs: strided and expanded (stride 0) tensors,
NaN / +-inf / negative / all-zero / all -inf rows, huge logits, edge temperatures (0, 1e-38,
+inf, negative, NaN) or per-request SamplingParams (top-k / top-p / min-p, extreme values
included), out-of-range ids, point-mass drafts, and inconsistent ragged metadata.

A violation is:

* an exception that is not a ValueError whose message starts with the argument it is about;
* an output that is not [B, K+1] int64, a token outside [0, V) other than -1, -1 before a token;
* an emitted token the target gives probability 0 at its position (q per
  :func:`spec_samplers.torch_ops.probs_from_logits` for logits, NaN/Inf/negative as 0 for
  probabilities), an accepted position whose token is not the draft, or a bonus slot that holds
  anything but the bonus id (or, padded with an invalid bonus id, a token of the bonus row);
* no token at all where position 0 has one to give (a distribution in its target row, or a valid
  bonus id when k_b = 0), or a token from a malformed ragged request (docs/contract.md, "Robustness");
* the two backends answering differently (different tokens, or one raising and not the other).

Fixed seed; the Triton kernels run through the interpreter on the CPU.
"""

from __future__ import annotations

import os
import random

import torch

import spec_samplers.kernels.verify_launch  # noqa: F401  (kernels built under TRITON_INTERPRET=1)
from spec_samplers import BlockVerificationSampler, RejectionSampler, SamplingParams, TypicalAcceptanceSampler
from spec_samplers.sampling.reference import filtered_softmax_reference
from spec_samplers.sampling_params import sampling_tensors
from spec_samplers.torch_ops import clean_probs, probs_from_logits

SEED = int(os.environ.get("FUZZ_SEED", "20260509"))
#: CI runs 60 cases (under a minute); FUZZ_CASES=2000 runs a longer search by hand
NUM_CASES = int(os.environ.get("FUZZ_CASES", "60"))
INF, NAN = float("inf"), float("nan")
ARGUMENTS = {
    "target_with_bonus_probs",
    "target_probs",
    "target_logits",
    "draft_probs",
    "draft_logits",
    "draft_token_ids",
    "bonus_token_ids",
    "cu_num_draft_tokens",
    "max_spec_len",
    "temperature",
    "seeds",
    "offsets",
    "is_greedy",
    "sampling_params",
}
ENTRIES = ("forward", "forward_ragged", "forward_from_logits", "forward_ragged_from_logits")


def bend(t: torch.Tensor | None, rng: random.Random) -> torch.Tensor | None:
    """The same values in another memory layout: strided (every other element of a wider buffer)
    or, for 2-d and wider tensors, with the first dimensions' strides permuted."""
    if t is None or t.numel() == 0:
        return t
    kind = rng.choice(["plain", "strided", "transposed"])
    if kind == "strided":
        filler = torch.full_like(t, 7) if t.dtype != torch.bool else torch.ones_like(t)
        return torch.stack([t, filler], dim=-1)[..., 0]
    if kind == "transposed" and t.dim() >= 2:
        return t.transpose(0, -1).contiguous().transpose(0, -1)
    return t


def expand_rows(t: torch.Tensor, rng: random.Random) -> torch.Tensor:
    """Sometimes replace t by its first row expanded (stride 0 over the first dimension)."""
    if t.shape[0] > 1 and rng.random() < 0.15:
        return t[:1].expand(t.shape)
    return t


def poison_floats(t: torch.Tensor, rng: random.Random, logits: bool) -> torch.Tensor:
    """Edge values in a few entries or whole rows (in place on a copy)."""
    t = t.clone()
    rows = t.reshape(-1, t.shape[-1])
    if rows.shape[0] == 0:
        return t
    for _ in range(rng.randint(0, 3)):
        r, v = rng.randrange(rows.shape[0]), rng.randrange(rows.shape[1])
        kind = rng.choice(["nan", "posinf", "neginf", "negative", "huge", "zero_row", "neginf_row", "nan_row"])
        if kind == "nan":
            rows[r, v] = NAN
        elif kind == "posinf":
            rows[r, v] = INF
        elif kind == "neginf":
            rows[r, v] = -INF
        elif kind == "negative":
            rows[r, v] = -0.5
        elif kind == "huge":
            rows[r, v] = 3e38 if t.dtype == torch.float32 else 6e4 if t.dtype == torch.float16 else 3e38
        elif kind == "zero_row":
            rows[r] = 0.0
        elif kind == "neginf_row":
            rows[r] = -INF if logits else 0.0
        else:
            rows[r] = NAN
    return t


def make_case(rng: random.Random, gen: torch.Generator) -> dict:
    sampler = rng.choice(["rejection", "typical", "block"])
    entry = rng.choice(ENTRIES)
    ragged, logits = "ragged" in entry, "logits" in entry
    B, K, V = rng.randint(0, 3), rng.randint(0, 3), rng.choice([1, 2, 5, 17, 40])
    dtype = rng.choice([torch.float32, torch.float16, torch.bfloat16])
    scale = rng.choice([0.5, 3.0, 30.0])
    counts = [rng.randint(0, K) for _ in range(B)]
    rows_t = (sum(counts),) if ragged else (B, K + 1)
    rows_d = (sum(counts),) if ragged else (B, K)
    x_t = torch.randn(*rows_t, V, generator=gen) * scale
    x_d = (x_t if ragged else x_t[:, :K]) + torch.randn(*rows_d, V, generator=gen)  # drafts near the target
    target = x_t if logits else torch.softmax(x_t, -1)
    draft = x_d if logits else torch.softmax(x_d, -1)
    if rng.random() < 0.5:
        target = poison_floats(target, rng, logits)
    if rng.random() < 0.3:
        draft = poison_floats(draft, rng, logits)
    target, draft = expand_rows(target.to(dtype), rng), expand_rows(draft.to(dtype), rng)
    if rng.random() < 0.3 or sampler == "typical" and rng.random() < 0.5:
        draft = None
    ids = torch.randint(0, V, rows_d, generator=gen)
    if ids.numel() and rng.random() < 0.3:
        ids.view(-1)[rng.randrange(ids.numel())] = rng.choice([-1, V, 2**40])
    bonus = torch.randint(0, V, (B, 1), generator=gen)
    if B and rng.random() < 0.3:
        bonus[rng.randrange(B), 0] = rng.choice([-3, V, 2**40])
    id_dtype = rng.choice([torch.int32, torch.int64])
    if id_dtype == torch.int32:
        ids, bonus = ids.clamp(-(2**31), 2**31 - 1).int(), bonus.clamp(-(2**31), 2**31 - 1).int()
    kwargs: dict = {}
    args: list = [
        bend(target, rng),
        bend(bonus if not ragged or rng.random() < 0.5 else bonus[:, 0], rng),
        bend(draft, rng),
        bend(ids, rng),
    ]
    cu = torch.tensor(counts, dtype=torch.int64).cumsum(0) if B else torch.zeros(0, dtype=torch.int64)
    max_spec_len = K
    if ragged:
        if B and rng.random() < 0.3:
            bad = rng.choice(["past_T", "non_monotone", "too_long", "negative", "huge"])
            b = rng.randrange(B)
            cu = cu.clone()
            if bad == "past_T":
                cu[b] += rng.randint(1, 3)
            elif bad == "non_monotone":
                cu[b] -= rng.randint(1, 3)
            elif bad == "too_long":
                max_spec_len = max(K - 1, 0)
            elif bad == "negative":
                cu[b] = -rng.randint(1, 5)
            else:
                cu[b] = 2**62
        if rng.random() < 0.1:
            max_spec_len = rng.choice([-1, 2**40])
        fits_int32 = all(abs(c) < 2**31 for c in cu.tolist())
        args += [bend(cu.to(rng.choice([torch.int32, torch.int64])) if fits_int32 else cu, rng), max_spec_len]
    params = None
    if logits and rng.random() < 0.4:  # per-request SamplingParams, applied by the samplers themselves
        params = [
            SamplingParams(
                temperature=rng.choice([0.0, 0.7, 1.0, 3.0]),
                top_k=rng.choice([0, 1, 3, 50]),
                top_p=rng.choice([1.0, 0.9, 0.5, 1e-6]),
                min_p=rng.choice([0.0, 0.1, 1.0]),
            )
            for _ in range(B)
        ]
        kwargs["sampling_params"] = params
    elif logits:
        temps = [rng.choice([0.0, 0.5, 1.0, 2.0, INF, 1e-38, -1.0, NAN, 1.0]) for _ in range(B)]
        args.append(bend(expand_rows(torch.tensor(temps, dtype=torch.float32), rng), rng))
    if sampler in ("rejection", "block"):
        kwargs["seeds"] = bend(expand_rows(torch.randint(-(2**62), 2**62, (B,), generator=gen), rng), rng)
        if rng.random() < 0.5:
            kwargs["offsets"] = bend(torch.randint(0, 2**40, (B,), generator=gen), rng)
        if not logits and rng.random() < 0.4:
            kwargs["is_greedy"] = bend(torch.rand(B, generator=gen) < 0.5, rng)
    options = dict(strict_mode=rng.random() < 0.3, check_values=rng.random() < 0.2)
    return dict(
        sampler=sampler,
        entry=entry,
        args=args,
        kwargs=kwargs,
        options=options,
        B=B,
        K=K,
        V=V,
        ragged=ragged,
        logits=logits,
        params=params,
        max_spec_len=max_spec_len,
    )


def run(case: dict, backend: str) -> torch.Tensor | Exception:
    cls = {"rejection": RejectionSampler, "typical": TypicalAcceptanceSampler, "block": BlockVerificationSampler}[
        case["sampler"]
    ]
    sampler = cls(backend=backend, **case["options"])
    try:
        return getattr(sampler, case["entry"])(*case["args"], **case["kwargs"])
    except Exception as e:  # judged by the caller
        return e


def q_rows(case: dict) -> list[tuple[int, int, list[torch.Tensor | None]]]:
    """Per request: (first flat row, k_b (-1: malformed request), q at each position per the
    contract (None: no row))."""
    B, K = case["B"], case["max_spec_len"]
    target = case["args"][0]
    if case["ragged"]:
        cu = case["args"][4].to(torch.int64).tolist()
        T = target.shape[0]
        spans = []
        for b in range(B):
            s, e = (cu[b - 1] if b else 0), cu[b]
            spans.append((s, e - s) if 0 <= s <= e <= T and e - s <= K else (0, -1))
    else:
        spans = [(0, K)] * B
    out = []
    for b in range(B):
        s, n = spans[b]
        rows = []
        for i in range(K + 1):
            if case["ragged"]:
                row = target[s + i] if 0 <= i < n else None
            else:
                row = target[b, i]
            if row is not None:
                if case["params"] is not None:  # the processed target (vLLM's order)
                    st = sampling_tensors(case["params"][b], 1, "cpu")
                    t = torch.where(st.is_greedy, 0.0, st.temperature)
                    row = filtered_softmax_reference(row[None], t, st.top_k, st.top_p, st.min_p)[0]
                elif case["logits"]:
                    row = probs_from_logits(row[None], case["args"][-1][b : b + 1])[0]
                else:
                    row = clean_probs(row)
            rows.append(row)
        out.append((s, n, rows))
    return out


def violations(case: dict, out: torch.Tensor) -> list[str]:
    B, K, V = case["B"], case["max_spec_len"], case["V"]
    found = []
    if out.dtype != torch.int64 or tuple(out.shape) != (B, K + 1):
        return [f"output {out.dtype} {tuple(out.shape)}, expected int64 {(B, K + 1)}"]
    ids = case["args"][3].to(torch.int64)
    bonus = case["args"][1].reshape(-1).to(torch.int64)
    for b, (start, n, rows) in enumerate(q_rows(case)):
        row = out[b].tolist()
        emitted = next((i for i, t in enumerate(row) if t == -1), K + 1)
        if any(t != -1 for t in row[emitted:]):
            found.append(f"request {b}: -1 before a token: {row}")
        if any(not 0 <= t < V for t in row[:emitted]):
            found.append(f"request {b}: token outside [0, {V}): {row}")
            continue
        if n < 0:
            if emitted:
                found.append(f"request {b}: malformed ragged request emitted {row}")
            continue
        for j in range(emitted):
            t = row[j]
            if j < n:
                draft_j = int(ids[start + j] if case["ragged"] else ids[b, j])
                if j < emitted - 1 and t != draft_j:
                    found.append(f"request {b}: position {j} holds {t}, not the accepted draft {draft_j}")
                if not float(rows[j][t]) > 0:
                    found.append(f"request {b}: token {t} at position {j} has target probability 0")
            elif j == n:
                if 0 <= int(bonus[b]) < V:
                    if t != int(bonus[b]):
                        found.append(f"request {b}: bonus slot {t}, bonus id {int(bonus[b])}")
                elif rows[j] is None or not float(rows[j][t]) > 0:
                    found.append(f"request {b}: resampled bonus {t} has target probability 0")
            else:
                found.append(f"request {b}: token past k_b = {n}: {row}")
        if emitted == 0:  # position 0 is then the first rejection (or, k_b = 0, the bonus slot)
            has_dist = rows[0] is not None and bool((rows[0] > 0).any())
            bonus_ok = n == 0 and 0 <= int(bonus[b]) < V
            if bonus_ok or (n > 0 and has_dist) or (n == 0 and has_dist and not case["ragged"]):
                found.append(f"request {b}: no token at position 0 where one exists: {row}")
    return found


def judge_error(e: Exception) -> str | None:
    name = str(e).split(":", 1)[0]
    if isinstance(e, ValueError) and name in ARGUMENTS:
        return None
    return f"{type(e).__name__}: {str(e)[:200]}"


def test_fuzz_contract():
    rng = random.Random(SEED)
    gen = torch.Generator().manual_seed(SEED)
    problems = []
    stats = {"ok": 0, "error": 0}
    for n in range(NUM_CASES):
        case = make_case(rng, gen)
        where = (
            f"case {n} ({case['sampler']}.{case['entry']}, B={case['B']} K={case['K']} V={case['V']} {case['options']})"
        )
        results = [run(case, backend) for backend in ("torch", "triton")]
        for backend, res in zip(("torch", "triton"), results):
            if isinstance(res, Exception):
                bad = judge_error(res)
                if bad:
                    problems.append(f"{where} {backend}: {bad}")
            else:
                problems += [f"{where} {backend}: {v}" for v in violations(case, res)]
        a, b = results
        if isinstance(a, Exception) != isinstance(b, Exception):
            problems.append(f"{where}: one backend raised: torch {a!r:.120}, triton {b!r:.120}")
        elif isinstance(a, Exception):
            stats["error"] += 1
            if str(a) != str(b):
                problems.append(f"{where}: different errors: {a} / {b}")
        else:
            stats["ok"] += 1
            if not torch.equal(a, b):
                problems.append(f"{where}: backends disagree:\ntorch  {a.tolist()}\ntriton {b.tolist()}")
    assert problems == [], "\n".join(problems)
    # the fuzz must exercise both outcomes
    assert stats["ok"] >= NUM_CASES // 3 and stats["error"] >= 3, stats
