"""Input audit of the tensor arguments the lean-call round (0ac3ec0..143a82a) added or changed.

The project standard: every tensor argument may arrive strided, expanded (stride 0), transposed or
in another dtype, or hold bad values; the answer is the one its contiguous copy gets, the same on
every backend ("torch": the PyTorch reference, "auto": on CPU the compiled numba twin where one
exists, "triton": the kernels under TRITON_INTERPRET=1), and bad values give a clear error in
strict mode or a valid output without it (never a token of probability 0, never out of range).

What other files cover is not repeated here: parameter dtypes and seed forms of the sampling
operations (tests/test_sampling_kernels.py), strided chain-entry metadata (tests/test_robustness.py),
bad tree and seam values (tests/test_fuzz_tree_and_seams.py). Shapes are tiny: the kernels run in
the interpreter.
"""

from __future__ import annotations

import pytest
import torch

import spec_samplers.kernels.verify_launch  # noqa: F401  (kernels built under TRITON_INTERPRET=1)
import spec_samplers.sampling as sampling
from spec_samplers import BlockVerificationSampler, RejectionSampler, TypicalAcceptanceSampler

pytestmark = pytest.mark.kernels  # runs the Triton kernels (interpreted)

BACKENDS = ("torch", "auto", "triton")
SAMPLERS = {"rejection": RejectionSampler, "typical": TypicalAcceptanceSampler, "block": BlockVerificationSampler}
NAN, INF = float("nan"), float("inf")


def bend(t: torch.Tensor | None, how: str) -> torch.Tensor | None:
    """The same shape in another memory layout: "strided" (every other element of a wider
    buffer, the values kept), "expanded" (element 0 along dim 0, stride 0: the values change, so
    compare with the contiguous copy of the result) or "transposed" (last two dims column-major)."""
    if t is None:
        return None
    if how == "strided":
        filler = torch.ones_like(t) if t.dtype == torch.bool else torch.full_like(t, 3)
        return torch.stack([t, filler], -1)[..., 0]
    if how == "expanded":
        return t[:1].expand(t.shape)
    if how == "transposed" and t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    return t


def contiguous(value: object) -> object:
    return value.contiguous() if isinstance(value, torch.Tensor) else value


# -- tree entries: per-request tensors in any layout -------------------------------------------------
#
# Regression: the tree kernels read seeds, offsets, is_greedy, temperature and cu_num_nodes at
# ``ptr + b``; a strided view read its neighbours' values and an expanded one read past its one
# element of storage (fixed in kernels/tree_launch.py, _per_request).

TREE_B, TREE_N, TREE_V = 2, 4, 8
TREE_COUNTS = [3, 4]  # ragged: N_b nodes per request


def tree_inputs(logits: bool) -> dict:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(TREE_B, TREE_N + 1, TREE_V, generator=g) * 2
    y = x + torch.randn(TREE_B, TREE_N + 1, TREE_V, generator=g) * 0.5
    q, p = (x, y) if logits else (torch.softmax(x, -1), torch.softmax(y, -1))
    tokens = torch.multinomial(torch.softmax(y[:, :TREE_N], -1).reshape(-1, TREE_V), 1, generator=g)
    return dict(
        q=q,
        p=p,
        tokens=tokens.view(TREE_B, TREE_N),
        parents=torch.tensor([[0, 0, 1, 2], [0, 1, 1, 0]]),
        seeds=torch.tensor([5, 6]),
        offsets=torch.tensor([1, 2]),
        temperature=torch.tensor([0.7, 1.3]),
        is_greedy=torch.tensor([False, True]),
        cu=torch.tensor(TREE_COUNTS).cumsum(0),
    )


def run_tree(sampler: str, entry: str, backend: str, a: dict) -> torch.Tensor:
    s = SAMPLERS[sampler](backend=backend)
    random = sampler != "typical"
    draft = a["p"] if random else None
    kw = dict(seeds=a["seeds"], offsets=a["offsets"]) if random else {}
    if random and "logits" not in entry:
        kw["is_greedy"] = a["is_greedy"]
    if "ragged" in entry:
        span = [slice(0, n + 1) for n in TREE_COUNTS]
        rows = torch.cat([a["q"][b, span[b]] for b in range(TREE_B)])
        d_rows = None if draft is None else torch.cat([draft[b, span[b]] for b in range(TREE_B)])
        flat_tok = torch.cat([a["tokens"][b, : TREE_COUNTS[b]] for b in range(TREE_B)])
        flat_par = torch.cat([a["parents"][b, : TREE_COUNTS[b]] for b in range(TREE_B)])
        args = [rows, d_rows, flat_tok, flat_par, a["cu"], TREE_N]
    else:
        args = [a["q"], draft, a["tokens"], a["parents"]]
    if "logits" in entry:
        args.append(a["temperature"])
    out = getattr(s, entry)(*args, **kw)
    return torch.cat([out.token_ids, out.node_ids], 1)


TREE_ENTRIES = ("forward_tree", "forward_tree_ragged", "forward_tree_from_logits", "forward_tree_ragged_from_logits")


@pytest.mark.parametrize("how", ["expanded", "strided"])
@pytest.mark.parametrize("entry", TREE_ENTRIES)
@pytest.mark.parametrize("sampler", ["rejection", "typical"])  # (the block sampler's trees: the reference only)
def test_tree_entries_read_bent_tensors_like_their_contiguous_copies(sampler, entry, how):
    a = tree_inputs("logits" in entry)
    bent = {k: bend(v, how) if k not in ("q", "p") else bend(v, "transposed") for k, v in a.items()}
    if how == "expanded":  # stride-0 rows of the target and draft too
        bent["q"], bent["p"] = bend(a["q"], "expanded"), bend(a["p"], "expanded")
    want = run_tree(sampler, entry, "torch", {k: contiguous(v) for k, v in bent.items()})
    for backend in BACKENDS:
        assert torch.equal(run_tree(sampler, entry, backend, bent), want), backend


@pytest.mark.parametrize("how", ["strided", "expanded"])
@pytest.mark.parametrize("entry", ["forward_tree", "forward_tree_ragged_from_logits"])
def test_multipath_reads_bent_tensors_like_their_contiguous_copies(entry, how, monkeypatch):
    """The GBV kernels (kernels/multipath_*) on K = 2 paths of L = 2: bent tokens, parents
    (tensor, without max_depth), seeds, offsets, counts and rows give the contiguous copy's tokens."""
    from spec_samplers.multipath import MultipathBlockVerificationSampler
    from spec_samplers.tree.multipath import path_parents

    monkeypatch.setitem(SAMPLERS, "multipath", MultipathBlockVerificationSampler)
    monkeypatch.setattr(f"{__name__}.TREE_COUNTS", [4, 4])
    a = tree_inputs("logits" in entry)
    a["parents"] = torch.tensor([path_parents(2, 2)] * TREE_B)
    bent = {k: bend(v, how) if k not in ("q", "p") else bend(v, "transposed") for k, v in a.items()}
    want = run_tree("multipath", entry, "torch", {k: contiguous(v) for k, v in bent.items()})
    for backend in BACKENDS:
        assert torch.equal(run_tree("multipath", entry, backend, bent), want), backend


# -- sampling operations: every argument bent at once ----------------------------------------------

SAMPLING_B, SAMPLING_V = 4, 24


def sampling_inputs() -> dict:
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(SAMPLING_B, SAMPLING_V, generator=g) * 3, -1)
    return dict(
        probs=probs,
        logits=torch.log(probs),
        top_k=torch.tensor([3, 1, 0, 5]),
        top_p=torch.tensor([0.5, 0.9, 0.3, 1.0]),
        min_p=torch.tensor([0.1, 0.2, 0.0, 0.5]),
        temperature=torch.tensor([0.5, 1.0, 0.0, 2.0]),
        seed=torch.tensor([1, 2, 3, 4]),
        offset=torch.tensor([0, 5, 9, 2**40]),
        indices=torch.tensor([3, 0, 0, 2]),
    )


SAMPLING_OPS = {
    "sampling_from_probs": lambda a, b: sampling.sampling_from_probs(
        a["probs"], a["indices"], seed=a["seed"], offset=a["offset"], return_valid=True, backend=b
    ),
    "sampling_from_logits": lambda a, b: sampling.sampling_from_logits(
        a["logits"], a["indices"], seed=a["seed"], offset=a["offset"], backend=b
    ),
    "top_k_sampling_from_probs": lambda a, b: sampling.top_k_sampling_from_probs(
        a["probs"], a["top_k"], a["indices"], seed=a["seed"], offset=a["offset"], backend=b
    ),
    "top_p_sampling_from_probs": lambda a, b: sampling.top_p_sampling_from_probs(
        a["probs"], a["top_p"], a["indices"], seed=a["seed"], offset=a["offset"], backend=b
    ),
    "min_p_sampling_from_probs": lambda a, b: sampling.min_p_sampling_from_probs(
        a["probs"], a["min_p"], a["indices"], seed=a["seed"], offset=a["offset"], backend=b
    ),
    "top_k_top_p_sampling_from_logits": lambda a, b: sampling.top_k_top_p_sampling_from_logits(
        a["logits"], a["top_k"], a["top_p"], a["indices"], seed=a["seed"], offset=a["offset"], backend=b
    ),
    "top_k_top_p_sampling_from_probs": lambda a, b: sampling.top_k_top_p_sampling_from_probs(
        a["probs"], a["top_k"], a["top_p"], a["indices"], "joint", seed=a["seed"], offset=a["offset"], backend=b
    ),
    "top_k_renorm_probs": lambda a, b: sampling.top_k_renorm_probs(a["probs"], a["top_k"], backend=b),
    "top_p_renorm_probs": lambda a, b: sampling.top_p_renorm_probs(a["probs"], a["top_p"], backend=b),
    "top_k_mask_logits": lambda a, b: sampling.top_k_mask_logits(a["logits"], a["top_k"], backend=b),
    "softmax": lambda a, b: sampling.softmax(a["logits"], a["temperature"], backend=b),
}


def same(x: object, y: object) -> bool:
    xs, ys = (x if isinstance(x, tuple) else (x,)), (y if isinstance(y, tuple) else (y,))
    for u, v in zip(xs, ys, strict=True):
        if u.is_floating_point():  # softmax: row sums accumulate in another order on the kernels
            if not torch.allclose(u, v, atol=1e-6, rtol=1e-5):
                return False
        elif not torch.equal(u, v):
            return False
    return True


#: (the bend of the [R, V] matrices, the bend of the [B] vectors): two calls cover every layout
SAMPLING_BENDS = {"transposed-strided": ("transposed", "strided"), "expanded-expanded": ("expanded", "expanded")}


@pytest.mark.parametrize("how", list(SAMPLING_BENDS))
@pytest.mark.parametrize("op", list(SAMPLING_OPS))
def test_sampling_ops_read_bent_arguments_like_their_contiguous_copies(op, how):
    """Probabilities / logits (column-major, or stride-0 rows) with per-request parameters, seeds,
    offsets and indices (strided, or stride 0): the contiguous copy's output on both paths."""
    matrices, vectors = SAMPLING_BENDS[how]
    bent = {k: bend(v, matrices if v.dim() == 2 else vectors) for k, v in sampling_inputs().items()}
    want = SAMPLING_OPS[op]({k: v.contiguous() for k, v in bent.items()}, "torch")
    for backend in ("torch", "triton"):
        assert same(SAMPLING_OPS[op](bent, backend), want), backend


def test_sampling_ops_bad_values_without_check_nan_give_valid_tokens():
    """check_nan=False: NaN / +inf / negative probabilities and parameters out of range (k < 0 or
    huge, top_p NaN / <= 0 / > 1, min_p NaN / negative / > 1) give, on both paths, the same tokens,
    each of positive probability, or -1 for a row without mass."""
    g = torch.Generator().manual_seed(1)
    B, V = 5, 16
    probs = torch.softmax(torch.randn(B, V, generator=g) * 3, -1)
    probs[0, 3:] = 0.0
    probs[1, 2], probs[2, 4], probs[3, 5] = NAN, INF, -1.0
    probs[4] = NAN  # no mass at all
    top_k = torch.tensor([-3, 0, 2**40, 1, 2])
    top_p = torch.tensor([NAN, -0.5, 0.0, INF, 1.5])
    min_p = torch.tensor([NAN, -1.0, 2.0, INF, -INF])
    mass = torch.where(torch.isfinite(probs) & (probs > 0), probs, 0.0)
    calls = [  # (top-k and top-p alone share these kernels' prologue and search)
        lambda b: sampling.top_k_top_p_sampling_from_probs(probs, top_k, top_p, seed=1, backend=b),
        lambda b: sampling.min_p_sampling_from_probs(probs, min_p, seed=1, backend=b),
    ]
    for i, call in enumerate(calls):
        tokens = call("torch")
        assert torch.equal(call("triton"), tokens), i
        for b, t in enumerate(tokens.tolist()):
            assert (t == -1) == (b == 4), (i, b, t)
            assert t == -1 or mass[b, t] > 0, (i, b, t)


# -- vLLM seams: the metadata tensors bent -------------------------------------------------------


def v2_args() -> list:
    """Model Runner V2's verify arguments: R = 3 requests in states 4, 0, 2 of 5, S = 2."""
    g = torch.Generator().manual_seed(5)
    states, counts, V = [4, 0, 2], [3, 1, 2], 12
    L = sum(counts)
    cu = torch.zeros(len(counts) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(counts).cumsum(0)
    return [
        torch.randn(L, V, generator=g) * 2,  # target_logits
        None,  # draft_logits
        torch.randint(0, V, (L,), generator=g).int(),  # draft_sampled
        cu,  # cu_num_logits
        torch.randint(0, 100, (L,), generator=g),  # pos
        torch.tensor(states, dtype=torch.int32),  # idx_mapping
        torch.tensor(sum(([s] * c for s, c in zip(states, counts)), []), dtype=torch.int32),  # expanded_idx_mapping
        torch.tensor(sum((list(range(c)) for c in counts), []), dtype=torch.int32),  # expanded_local_pos
        torch.tensor([0.7, 1.0, 0.0, 1.3, 0.9]),  # temperature
        torch.randint(0, 2**40, (5,), generator=g),  # seed
        2,  # num_speculative_steps
    ]


def v1_args(mode: str) -> tuple[list, object]:
    """V1's verify arguments (B = 3, K = 2, counts 2, 0, 1) and its sampling metadata."""
    from types import SimpleNamespace

    g = torch.Generator().manual_seed(6)
    counts, V = [2, 0, 1], 12
    temperature = torch.tensor([0.0, 1.0, 1.0]) if mode == "mixed" else torch.ones(3)
    args = [
        torch.randint(0, V, (sum(counts),), generator=g).int(),  # draft_token_ids
        counts,
        2,  # max_spec_len
        torch.tensor(counts).cumsum(0).int(),  # cu_num_draft_tokens
        None,  # draft_probs
        torch.randn(sum(counts), V, generator=g) * 2,  # target_logits
        torch.randint(0, V, (3, 1), generator=g).int(),  # bonus_token_ids
        temperature,
    ]
    meta = SimpleNamespace(all_greedy=False, all_random=mode == "random", generators={})
    return args, meta


def run_v1(args: list, meta: object, sampler: str, backend: str) -> torch.Tensor:
    from spec_samplers.integrations.vllm import v1_runner
    from spec_samplers.integrations.vllm.ragged import RaggedVerifier

    meta.temperature = args[-1]
    torch.manual_seed(0)  # the requests without a generator draw their seeds from torch's
    return v1_runner.verify(RaggedVerifier(SAMPLERS[sampler](backend=backend)), *args[:-1], meta)


@pytest.mark.parametrize("how", ["strided", "expanded", "int64"])
@pytest.mark.parametrize("sampler", ["rejection", "typical"])  # (block: the rejection sampler's seam path)
def test_v2_seam_reads_bent_metadata_like_its_contiguous_copy(sampler, how):
    """cu_num_logits, idx_mapping, the expanded indices, draft_sampled, pos, temperatures and seeds
    strided or as int64 (the [max_num_reqs] temperatures and seeds also stride 0), the logits
    column-major: the contiguous copy's tokens on every backend."""
    from spec_samplers.integrations.vllm import v2_runner
    from spec_samplers.integrations.vllm.ragged import RaggedVerifier

    args = v2_args()
    bent = list(args)
    for i in (2, 3, 4, 5, 6, 7):  # [L] and [R+1] / [R] int metadata (expanded would change the layout's meaning)
        bent[i] = args[i].long() if how == "int64" else bend(args[i], "strided")
    bent[0] = bend(args[0], "transposed")
    bent[8], bent[9] = (bend(args[8], "expanded"), bend(args[9], "expanded")) if how == "expanded" else args[8:10]
    want = v2_runner.verify(RaggedVerifier(SAMPLERS[sampler](backend="torch")), *[contiguous(a) for a in bent])
    for backend in BACKENDS:
        got = v2_runner.verify(RaggedVerifier(SAMPLERS[sampler](backend=backend)), *bent)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), backend


@pytest.mark.parametrize("how", ["strided", "expanded", "int64"])
@pytest.mark.parametrize("mode", ["mixed", "random"])
def test_v1_seam_reads_bent_metadata_like_its_contiguous_copy(mode, how):
    """draft_token_ids, cu_num_draft_tokens, bonus_token_ids strided or int64, the logits
    column-major or stride-0 rows, the temperatures strided or stride 0: the contiguous copy's
    tokens on every backend (rejection sampler; the seam is the same for the others)."""
    args, meta = v1_args(mode)
    bent = list(args)
    for i in (0, 3, 6):
        bent[i] = args[i].long() if how == "int64" else bend(args[i], "strided")
    bent[5] = bend(args[5], "expanded" if how == "expanded" else "transposed")
    bent[7] = bend(args[7], "expanded" if how == "expanded" else "strided")
    want = run_v1([contiguous(a) for a in bent], meta, "rejection", "torch")
    for backend in BACKENDS:
        assert torch.equal(run_v1(bent, meta, "rejection", backend), want), backend


def test_chain_speculative_sampling_reads_bent_arguments_like_their_contiguous_copies():
    """FlashInfer's chain op: draft / target rows column-major, draft ids strided int32, seeds
    and offsets stride 0, a strided int64 counter added to in place: the contiguous copy's output
    on every backend."""
    g = torch.Generator().manual_seed(2)
    B, n, V = 3, 2, 10
    draft = torch.softmax(torch.randn(B, n, V, generator=g), -1)
    target = torch.softmax(torch.randn(B, n + 1, V, generator=g), -1)
    ids = torch.multinomial(draft.view(-1, V), 1, generator=g).view(B, n)
    args = [bend(draft, "transposed"), bend(ids.int(), "strided"), bend(target, "transposed")]
    rnd = dict(seed=bend(torch.tensor([4, 5, 6]), "expanded"), offset=bend(torch.tensor([0, 1, 2]), "expanded"))
    want = sampling.chain_speculative_sampling(*[a.contiguous() for a in args], **rnd, backend="torch")
    for backend in BACKENDS:
        accepted = bend(torch.zeros(B, dtype=torch.int64), "strided")
        got = sampling.chain_speculative_sampling(*args, accepted, **rnd, backend=backend)
        assert all(torch.equal(x, y) for x, y in zip(got, want, strict=True)), backend
        assert torch.equal(accepted, want[1].long()), backend  # the view was added to in place
