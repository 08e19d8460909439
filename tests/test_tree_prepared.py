"""A warm tree entry (issue 40): a call of a shape checked before runs only what depends on the
values (spec_samplers.tree.entries: ``TreeEntries._tree_memo``, ``_run_tree_prepared``), and a warm
``sampling_params=`` call reads unchanged SamplingParams objects once (``filter_tensors``).

The memo must change nothing a caller sees: the same tokens and counters as a fresh sampler's,
the same error, by name, for any argument the remembered shape does not vouch for, and every call
checked in strict mode (a key without the types of ``max_depth`` or of a parents list fails
``test_warm_call_raises_what_a_fresh_sampler_raises``: shown once on that planted fault). On CPU
the tree kernel runs in the interpreter, so shapes stay small."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import DEVICE, KERNEL_BACKEND

from spec_samplers import RejectionSampler, SamplingParams, TypicalAcceptanceSampler
from spec_samplers.sampling_params import filter_tensors

pytestmark = pytest.mark.kernels

B, V, PARENTS = 2, 8, [0, 0, 1, 1, 3]  # N = 5 nodes, depth 3


def _inputs(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    N = len(PARENTS)
    return dict(
        target=torch.softmax(torch.randn(B, N + 1, V, generator=g), -1).to(DEVICE),
        draft=torch.softmax(torch.randn(B, N + 1, V, generator=g), -1).to(DEVICE),
        tokens=torch.randint(0, V, (B, N), generator=g).to(DEVICE),
        seeds=torch.tensor([5, 6], device=DEVICE),
    )


def _call(s: RejectionSampler, x: dict, **kwargs) -> object:
    args = (x["target"], x["draft"], x["tokens"], kwargs.pop("parents", PARENTS))
    return s.forward_tree(*args, **{"seeds": x["seeds"], **kwargs})


def _counters(s) -> list:
    return [s.num_accepted_tokens.cpu(), s.num_emitted_tokens.cpu(), s.num_accepted_per_position.cpu()]


def test_warm_call_same_tokens_and_counters_as_a_fresh_sampler():
    """Three calls of one shape on one sampler (the second and third from the memo; the inputs
    change between them) against each call on a fresh sampler, and the tokens added up."""
    warm = RejectionSampler(backend=KERNEL_BACKEND)
    fresh_out = []
    for seed in (0, 1, 2):
        x = _inputs(seed)
        out = _call(warm, x)
        fresh = RejectionSampler(backend=KERNEL_BACKEND)
        ref = _call(fresh, x)
        fresh_out.append(fresh)
        assert torch.equal(out.token_ids.cpu(), ref.token_ids.cpu()) and torch.equal(out.node_ids, ref.node_ids)
    if KERNEL_BACKEND == "triton" or DEVICE != "cpu":  # the kernel path is the one remembered
        assert len(warm._prepared) == 1
    total = [sum(c) for c in zip(*(_counters(f) for f in fresh_out))]
    for a, b in zip(_counters(warm), total):
        assert torch.equal(a, b)
    assert warm.num_draft_tokens == 3 * B * len(PARENTS)
    # a copy prepares its calls again and gives the same tokens
    x = _inputs(3)
    twin = copy.deepcopy(warm)
    assert twin._prepared == {}
    assert torch.equal(_call(twin, x).token_ids, _call(warm, x).token_ids)


def _outcome(fn) -> object:
    """The error a call raises (type and message), or its tokens."""
    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 (compared, not hidden)
        return f"{type(exc).__name__}: {exc}"
    return out.token_ids.tolist()


def _error(fn) -> str:
    with pytest.raises(Exception) as info:
        fn()
    return f"{type(info.value).__name__}: {info.value}"


@pytest.mark.parametrize(
    "bad",
    [
        dict(draft_sampling="greedy"),
        dict(max_depth=True),  # equal to 1 as a key, refused as a bool
        dict(max_depth=-1),
        dict(parents=[0, 0, 1.0, 1, 3]),  # equal to the list as a key, refused as a float
        dict(parents=[0, 0, 1]),
        dict(is_greedy=torch.zeros(B + 1, dtype=torch.bool)),
        dict(seeds=torch.tensor([5.0, 6.0])),
        dict(offsets=torch.zeros(B + 1, dtype=torch.int64)),
    ],
    ids=lambda d: next(iter(d)) + "=" + repr(next(iter(d.values())))[:24],
)
def test_warm_call_raises_what_a_fresh_sampler_raises(bad):
    """An argument the remembered shape does not vouch for is checked again: the warm sampler
    raises the fresh sampler's error, by name (or runs as it does)."""
    bad = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in bad.items()}
    x = _inputs()
    warm = RejectionSampler(backend=KERNEL_BACKEND)
    _call(warm, x)
    _call(warm, x, max_depth=1)  # (True == 1 as a key)
    expected = _outcome(lambda: _call(RejectionSampler(backend=KERNEL_BACKEND), x, **dict(bad)))
    assert _outcome(lambda: _call(warm, x, **dict(bad))) == expected
    assert isinstance(expected, str) or "parents" in bad  # (a float parent may be read as given)
    typical = TypicalAcceptanceSampler(backend=KERNEL_BACKEND)  # a rule without seeds: seeds refused
    typical.forward_tree(x["target"], x["draft"], x["tokens"], PARENTS)
    message = _error(lambda: typical.forward_tree(x["target"], x["draft"], x["tokens"], PARENTS, seeds=x["seeds"]))
    assert "seeds" in message and "draws no random numbers" in message


def test_strict_mode_checks_every_call():
    strict = RejectionSampler(strict_mode=True, backend=KERNEL_BACKEND)
    x = _inputs()
    _call(strict, x)
    _call(strict, x)
    assert strict._prepared == {}
    bad = [0, 0, 1, 1, 9]  # parent 9 of node 5: refused by value in strict mode only
    assert "parents" in _error(lambda: _call(strict, x, parents=bad))


def test_filter_tensors_reads_changed_parameters():
    """Unchanged SamplingParams objects are read once; a list with another object, a mutable
    foreign object changed in place, and the caller writing into a result are all seen."""
    a, b = SamplingParams(temperature=0.5, top_k=3), SamplingParams(temperature=0)
    params = [a, b]
    first = filter_tensors(params, 2, DEVICE)
    first[0].fill_(7.0)  # the caller's own tensor: the next call is not affected
    again = filter_tensors(params, 2, DEVICE)
    assert again[0].tolist() == [0.5, 0.0] and again[1]["top_k"].tolist() == [3, 0]
    params[1] = SamplingParams(temperature=2.0, top_p=0.5)
    changed = filter_tensors(params, 2, DEVICE)
    assert changed[0].tolist() == [0.5, 2.0] and changed[1]["top_p"].tolist() == [1.0, 0.5]

    class Foreign:  # vLLM's SamplingParams is a mutable object with these fields
        temperature, top_p, top_k, min_p, seed = 1.0, 1.0, 0, 0.0, None

    foreign = Foreign()
    assert filter_tensors(foreign, 2, DEVICE)[1] == {}
    foreign.top_k = 2
    assert filter_tensors(foreign, 2, DEVICE)[1]["top_k"].tolist() == [2, 2]
    assert filter_tensors(None, 3, DEVICE)[0].tolist() == [1.0, 1.0, 1.0]
