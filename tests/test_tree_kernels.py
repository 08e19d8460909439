"""The tree kernel (spec_samplers.kernels.tree_kernels) gives the reference's tokens, token for
token: every policy, tree shape, greedy rows, ragged, logits, V > 1024, and awkward inputs
(strided, expanded, bf16, int32 ids and parents, NaN rows, out-of-range ids). On CPU the kernel
runs in the interpreter, so shapes stay small."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, KERNEL_BACKEND
from tree_cases import POLICIES, SHAPES, draw_tree_tokens, ragged_from_padded

from spec_samplers import BlockVerificationSampler, RejectionSampler


def _workload(shape, policy, B, V, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    parents = torch.tensor(shape)[None, :].expand(B, -1).contiguous()
    N = parents.shape[1]
    target = torch.softmax(2 * torch.randn(B, N + 1, V, generator=gen), -1)
    draft = torch.softmax(2 * torch.randn(B, N + 1, V, generator=gen), -1)
    # draws from each node's own draft row (the rows need not depend on depth here)
    tokens = torch.zeros(B, N, dtype=torch.int64)
    for row in range(B):
        tokens[row] = draw_tree_tokens(parents[row : row + 1], policy, gen, draft[row].double())[0]
    seeds = torch.randint(0, 2**62, (B,), generator=gen)
    return target.to(dtype), draft.to(dtype), tokens, parents, seeds


def _both(call, cls=RejectionSampler):
    """The call on the reference and on the kernel: same tokens, same nodes, same counters (the
    kernel adds them in its epilogue, the reference with eager ops)."""
    ref_sampler, ker_sampler = cls(backend="torch"), cls(backend=KERNEL_BACKEND)
    ref, ker = call(ref_sampler), call(ker_sampler)
    assert torch.equal(ref.token_ids.cpu(), ker.token_ids.cpu()), (ref.token_ids, ker.token_ids)
    assert torch.equal(ref.node_ids.cpu(), ker.node_ids.cpu())
    for name in ("num_accepted_tokens", "num_emitted_tokens", "num_accepted_per_position"):
        assert torch.equal(getattr(ref_sampler, name).cpu(), getattr(ker_sampler, name).cpu()), name
    assert ref_sampler.num_draft_tokens == ker_sampler.num_draft_tokens
    return ref


def _dev(*ts):
    return [None if t is None else t.to(DEVICE) for t in ts]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("shape", ["binary", "uneven", "chain"])
def test_kernel_equals_reference(shape, policy):
    target, draft, tokens, parents, seeds = _dev(*_workload(SHAPES[shape], policy, 6, 9, seed=len(shape)))
    _both(lambda s: s.forward_tree(target, draft, tokens, parents, policy, seeds=seeds))


@pytest.mark.parametrize("policy", POLICIES)
def test_block_tree_kernel_equals_traversal_reference(policy):
    """The Traversal Verification kernel (block_tree_kernel) gives traversal_tree_reference's
    tokens: greedy rows, out-of-range children (skipped), detached nodes, a vanishing residual
    (target = draft), ragged trees and a malformed request, logits at T = 0 / hot, point-mass
    drafts (draft None), the chain given as a tree."""
    cls = BlockVerificationSampler
    target, draft, tokens, parents, seeds = _dev(*_workload(SHAPES["uneven"], policy, 4, 16, seed=31))
    tokens[2, 0] = -3  # skipped: its subtree can never pass
    tokens[3, 2] = 99
    target[1] = draft[1]  # residuals of mass ~0 (kept)
    greedy = torch.tensor([False, True, False, False], device=DEVICE)
    _both(lambda s: s.forward_tree(target, draft, tokens, parents, policy, seeds=seeds, is_greedy=greedy), cls)
    _both(lambda s: s.forward_tree(target, None, tokens, parents, policy, seeds=seeds, max_depth=2), cls)
    t, d, toks, pars, cu = ragged_from_padded(target, draft, tokens, parents, [6, 2, 0, 4])
    _both(lambda s: s.forward_tree_ragged(t, d, toks, pars.int(), cu, 6, policy, seeds=seeds), cls)
    bad = cu.clone()
    bad[1] = 3
    out = _both(lambda s: s.forward_tree_ragged(t, d, toks, pars, bad, 6, policy, seeds=seeds), cls)
    assert bool((out.token_ids[1] == -1).all())
    temperature = torch.tensor([0.0, 0.7, 1.3, 1.0], device=DEVICE)
    logits, dlogits = target.log(), draft.log()
    _both(lambda s: s.forward_tree_from_logits(logits, dlogits, tokens, parents, temperature, policy, seeds=seeds), cls)
    lt, ld = t.log(), d.log()
    _both(lambda s: s.forward_tree_ragged_from_logits(lt, ld, toks, pars, cu, 6, temperature, policy, seeds=seeds),
          cls)  # fmt: skip
    chain = list(range(5))
    c_target, c_draft, c_tokens, c_parents, c_seeds = _dev(*_workload(chain, policy, 4, 16, seed=33))
    _both(lambda s: s.forward_tree(c_target, c_draft, c_tokens, chain, policy, seeds=c_seeds), cls)


@pytest.mark.parametrize("policy", ["independent", "deterministic"])
def test_kernel_equals_reference_wide_vocabulary(policy):
    """V = 2100: several vocabulary blocks, a partial last one (and V > 1024)."""
    target, draft, tokens, parents, seeds = _dev(*_workload(SHAPES["binary"], policy, 3, 2100, seed=5))
    # make rejections likely: the target concentrates where the draft does not
    target = torch.softmax(-4 * draft.log().clamp(min=-30), -1)
    _both(lambda s: s.forward_tree(target, draft, tokens, parents, policy, seeds=seeds))


def test_kernel_greedy_ragged_and_logits():
    target, draft, tokens, parents, seeds = _dev(*_workload(SHAPES["uneven"], "independent", 4, 11, seed=7))
    greedy = torch.tensor([True, False, True, False], device=DEVICE)
    _both(lambda s: s.forward_tree(target, draft, tokens, parents, is_greedy=greedy, seeds=seeds))
    t, d, toks, pars, cu = ragged_from_padded(target, draft, tokens, parents, [6, 2, 0, 4])
    _both(lambda s: s.forward_tree_ragged(t, d, toks, pars, cu, 6, "without_replacement", seeds=seeds))
    temperature = torch.tensor([0.0, 0.7, 1.3, 1.0], device=DEVICE)
    _both(lambda s: s.forward_tree_from_logits(target.log(), draft.log(), tokens, parents, temperature, seeds=seeds))


def test_kernel_awkward_inputs():
    """Strided and expanded float inputs, bf16, int32 ids and parents, NaN rows, bad ids:
    each backend agrees with the other and with the plain fp32 call where the values agree."""
    target, draft, tokens, parents, seeds = _dev(*_workload(SHAPES["binary"], "independent", 4, 10, seed=9))
    plain = _both(lambda s: s.forward_tree(target, draft, tokens, parents, seeds=seeds))
    wide = torch.zeros(4, 7, 20, device=DEVICE)
    wide[..., ::2] = target  # vocab stride 2
    strided = wide[..., ::2]
    out = _both(lambda s: s.forward_tree(strided, draft, tokens.int(), parents.int(), seeds=seeds))
    assert torch.equal(out.token_ids, plain.token_ids)
    one = target[:1].expand(4, -1, -1)  # stride 0 over the batch
    _both(lambda s: s.forward_tree(one, draft[:1].expand(4, -1, -1), tokens, parents, seeds=seeds))
    _both(lambda s: s.forward_tree(target.bfloat16(), draft.half(), tokens, parents, seeds=seeds))
    bad_target = target.clone()
    bad_target[0] = float("nan")
    bad_target[1, :, 3] = float("inf")
    bad_tokens = tokens.clone()
    bad_tokens[2, 0] = -7
    bad_tokens[3, 1] = 10**6
    out = _both(lambda s: s.forward_tree(bad_target, draft, bad_tokens, parents, seeds=seeds))
    assert bool((out.token_ids[0] == -1).all())
    assert bool(((out.token_ids >= -1) & (out.token_ids < 10)).all())


def _both_typical(call):
    from spec_samplers import TypicalAcceptanceSampler

    return _both(call, TypicalAcceptanceSampler)


@pytest.mark.parametrize("rule", ["rejection", "typical", "block"])
def test_kernel_ragged_logits_and_bad_trees(rule):
    """What the kernels derive from the inputs as given (rows, cleaned parents, ragged spans),
    on both rules: ragged probabilities and logits, padded logits, sampling_params= (processed
    rows), parents outside [0, j) and -1, int32 spans, a malformed ragged request (emits
    nothing), the default width (N without a list of parents)."""
    from spec_samplers import SamplingParams, TypicalAcceptanceSampler

    cls = {"rejection": RejectionSampler, "typical": TypicalAcceptanceSampler}.get(rule, BlockVerificationSampler)
    target, draft, tokens, parents, seeds = _dev(*_workload(SHAPES["uneven"], "independent", 4, 11, seed=21))
    if rule == "typical":  # drafts near the target's mode so that some paths pass
        tokens = torch.where(torch.arange(tokens.shape[1], device=DEVICE) % 2 == 0, target[:, :-1].argmax(-1), tokens)
    rnd = dict(seeds=seeds) if rule != "typical" else {}
    N = tokens.shape[1]
    bad = parents.clone()
    bad[0, 2] = 5  # >= j: detached
    bad[1, 1] = -1
    bad[2, 3] = -9
    out = _both(lambda s: s.forward_tree(target, draft, tokens, bad.int(), **rnd), cls)
    assert out.token_ids.shape == (4, N + 1)  # tensor parents, no max_depth: D = N
    temperature = torch.tensor([0.0, 0.7, 1.3, 1.0], device=DEVICE)
    logits, dlogits = target.log(), draft.log()
    _both(lambda s: s.forward_tree_from_logits(logits, dlogits, tokens, bad, temperature, max_depth=3, **rnd), cls)
    params = [SamplingParams(temperature=0.8, top_k=4), SamplingParams(temperature=0.0)] * 2
    _both(lambda s: s.forward_tree_from_logits(logits, dlogits, tokens, parents, sampling_params=params, **rnd), cls)
    t, d, toks, pars, cu = ragged_from_padded(target, draft, tokens, bad, [6, 2, 0, 4])
    lt, ld = t.log(), d.log()
    _both(lambda s: s.forward_tree_ragged(t, d, toks, pars.int(), cu.int(), 6, **rnd), cls)
    _both(lambda s: s.forward_tree_ragged_from_logits(lt, ld, toks, pars, cu, 6, temperature, max_depth=2, **rnd), cls)
    malformed = cu.clone()
    malformed[1] = 3  # request 1 ends before it starts; request 2 then spans [3, 8)
    out = _both(lambda s: s.forward_tree_ragged(t, d, toks, pars, malformed, 6, **rnd), cls)
    assert bool((out.token_ids[1] == -1).all()) and bool((out.node_ids[1] == -1).all())


@pytest.mark.parametrize(("shape", "V"), [("binary", 9), ("uneven", 2100)])
def test_typical_tree_kernel_equals_reference(shape, V):
    target, _, tokens, parents, _ = _dev(*_workload(SHAPES[shape], "deterministic", 4, V, seed=13))
    # drafts near the target's mode so that some paths pass
    tokens = torch.where(torch.arange(tokens.shape[1], device=DEVICE) % 2 == 0, target[:, :-1].argmax(-1), tokens)
    out = _both_typical(lambda s: s.forward_tree(target, None, tokens, parents))
    assert bool((out.node_ids >= 0).any())
    bad = target.clone()
    bad[1] = float("nan")
    _both_typical(lambda s: s.forward_tree(bad.bfloat16(), None, tokens.int(), parents, max_depth=2))


def test_tree_kernels_compile_for_sm90(tmp_path):
    """Every tree-kernel variant compiles for a real GPU target (the interpreter accepts programs
    the compiler rejects); no GPU needed (Triton ships ptxas)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    here = Path(__file__).resolve().parent
    env["PYTHONPATH"] = os.pathsep.join([str(here.parent), str(here), env.get("PYTHONPATH", "")])
    script = here / "tree_compile_check.py"
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "compiled all tree kernel variants for sm_90: 61 variants" in proc.stdout


@pytest.mark.parametrize("policy", POLICIES)
def test_kernel_fuses_the_softmax_of_logits(policy):
    """Logits rows are read as softmax(x / T) inside the kernel (no probability tensor): the
    reference's tokens, with greedy (T = 0) and hot rows, NaN / -inf / +inf logits, bf16, V = 2100."""
    target, draft, tokens, parents, seeds = _dev(*_workload(SHAPES["binary"], policy, 4, 2100, seed=17))
    tl_, dl = target.log().clamp(min=-60), draft.log().clamp(min=-60)
    tl_[1, 2, :7] = float("nan")
    tl_[2, 0, 5] = float("inf")
    dl[3, 1] = float("-inf")
    temperature = torch.tensor([0.0, 0.7, 1.0, 2.5], device=DEVICE)
    _both(lambda s: s.forward_tree_from_logits(tl_, dl, tokens, parents, temperature, policy, seeds=seeds))
    _both(lambda s: s.forward_tree_from_logits(tl_.bfloat16(), dl.bfloat16(), tokens, parents, temperature, policy,
                                               seeds=seeds))  # fmt: skip


@pytest.mark.parametrize("rule", ["rejection", "block", "typical"])
def test_sampling_params_without_filters_reach_the_kernel_as_their_temperature(rule):
    """``sampling_params=`` without top-k/top-p/min-p is the softmax at its temperature: the
    kernel, which reads the logits through that rule, gets the temperature (it once got the
    raw logits as probabilities), padded and ragged, a greedy request included; equal to the
    reference and to ``temperature=``."""
    from spec_samplers import TypicalAcceptanceSampler
    from spec_samplers.sampling_params import SamplingParams

    cls = {"rejection": RejectionSampler, "block": BlockVerificationSampler, "typical": TypicalAcceptanceSampler}[rule]
    gen = torch.Generator().manual_seed(3)
    B, V, parents = 3, 24, [0, 0, 1, 1, 3]
    N = len(parents)
    target, draft = 3 * torch.randn(B, N + 1, V, generator=gen), 3 * torch.randn(B, N + 1, V, generator=gen)
    tokens = torch.randint(0, V, (B, N), generator=gen)
    params = [SamplingParams(temperature=0.8), SamplingParams(temperature=0.0), SamplingParams(temperature=1.3)]
    temperature = torch.tensor([0.8, 0.0, 1.3])
    seeds = dict(seeds=torch.tensor([1, 2, 3])) if rule != "typical" else {}
    padded = _both(
        lambda s: s.forward_tree_from_logits(target, draft, tokens, parents, sampling_params=params, **seeds), cls
    )
    plain = cls(backend=KERNEL_BACKEND).forward_tree_from_logits(target, draft, tokens, parents, temperature, **seeds)
    assert torch.equal(padded.token_ids.cpu(), plain.token_ids.cpu())
    cu = torch.tensor([N, 2 * N, 3 * N])
    rows = target.reshape(-1, V), draft.reshape(-1, V), tokens.reshape(-1), torch.tensor(parents * B), cu, N
    ragged = _both(lambda s: s.forward_tree_ragged_from_logits(*rows, sampling_params=params, **seeds), cls)
    width = padded.token_ids.shape[1]  # (the ragged output is max_nodes + 1 wide, -1 past the depth)
    assert torch.equal(ragged.token_ids[:, :width].cpu(), padded.token_ids.cpu())
    assert (ragged.token_ids[:, width:] == -1).all()


def _filter_workload(seed, B, V, ties):
    """Padded logits [B, N+1, V] (integer logits: ties everywhere, at the cuts too), tokens that
    are often the target's argmax (so that paths pass), per-request seeds."""
    gen = torch.Generator().manual_seed(seed)
    parents = [0, 0, 1, 1, 3]
    N = len(parents)
    target, draft = 3 * torch.randn(B, N + 1, V, generator=gen), 3 * torch.randn(B, N + 1, V, generator=gen)
    if ties:
        target, draft = target.round(), draft.round()
    tokens = torch.randint(0, V, (B, N), generator=gen)
    mode = target[:, torch.tensor(parents)].argmax(-1)  # [B, N]: the argmax of each node's parent row
    tokens = torch.where(torch.arange(N) % 2 == 0, mode, tokens)
    return target, draft, tokens, parents, torch.randint(0, 2**62, (B,), generator=gen)


@pytest.mark.parametrize(("seed", "ties", "dtype"), [(1, True, torch.float32), (2, False, torch.bfloat16),
                                                    (3, True, torch.bfloat16)])  # fmt: skip
@pytest.mark.parametrize("rule", ["rejection", "typical", "block"])
def test_filters_read_through_the_cuts_equal_the_reference(rule, seed, ties, dtype):
    """``sampling_params=`` with top-k / top-p / min-p: the kernel reads the logits through each
    row's (kept sum, cut) from ``tree_filter_cut_kernel`` (no probability rows), the reference
    judges filtered_softmax_reference's rows: the same tokens, nodes and counters, padded and
    ragged, fp32 and bf16, a few seeds, with a greedy request, ties at the cut (integer logits),
    top-k = 1, a tiny top-p and min-p."""
    from spec_samplers import SamplingParams, TypicalAcceptanceSampler

    cls = {"rejection": RejectionSampler, "block": BlockVerificationSampler, "typical": TypicalAcceptanceSampler}[rule]
    params = [
        SamplingParams(temperature=0.9, top_k=3),
        SamplingParams(temperature=0.0, top_k=2),  # greedy: vLLM resets its filters
        SamplingParams(temperature=1.2, top_p=0.05),
        SamplingParams(temperature=0.7, top_k=1, min_p=0.3),
        SamplingParams(temperature=1.5, top_k=6, top_p=0.7, min_p=0.1),
    ]
    B, V, N = len(params), 24, 5
    target, draft, tokens, parents, seeds = _filter_workload(seed, B, V, ties)
    target, draft, tokens, seeds = _dev(target.to(dtype), draft.to(dtype), tokens, seeds)
    rnd = dict(seeds=seeds) if rule != "typical" else {}
    _both(lambda s: s.forward_tree_from_logits(target, draft, tokens, parents, sampling_params=params, **rnd), cls)
    sizes = [N, 3, 0, N, 2]  # request 2: no nodes
    t, d, toks, pars, cu = _dev(*ragged_from_padded(target, draft, tokens, torch.tensor([parents] * B), sizes))
    _both(lambda s: s.forward_tree_ragged_from_logits(t, d, toks, pars, cu, N, sampling_params=params, **rnd), cls)
