"""A serving engine's batch size changes every step; the launchers must compile a bounded number
of kernel variants. The bound (docs/architecture.md, "Compiled variants"): for fixed k, V, dtype
and input kinds, a vocabulary-pass kernel takes at most len(BLOCK_V_CHOICES) = 3 variants and a
per-request combine kernel at most 9 (BLOCK_NB a power of two <= MAX_VOCAB_BLOCKS = 256) over
B = 1..1024; over k = 1..16 as well, at most 15 and 45.

Plans are built on the meta device (no memory, no kernels run) with the split a 132-SM GPU gets.
"""

from __future__ import annotations

import inspect
from collections import defaultdict

import torch

from spec_samplers.kernels import abi
from spec_samplers.kernels.abi import Rows
from spec_samplers.kernels.backend import BLOCK_V_CHOICES, MAX_VOCAB_BLOCKS, plan_vocab_split
from spec_samplers.kernels.verify_launch import BLOCK, REJECTION, plan_typical, plan_verify
from spec_samplers.layout import VerifyBatch

META = torch.device("meta")
SMS = 132


def _batch(B: int, k: int, V: int, logits: bool | str) -> VerifyBatch:
    target = torch.empty(B, k + 1, V, device=META)
    draft = torch.empty(B, k, V, device=META)
    ids = torch.empty(B, k, dtype=torch.int64, device=META)
    bonus = torch.empty(B, 1, dtype=torch.int64, device=META)
    seeds = torch.empty(B, dtype=torch.int64, device=META)
    extra = (
        {"temperature": torch.empty(B, device=META)}
        if logits
        else {"is_greedy": torch.empty(B, dtype=torch.bool, device=META)}
    )
    if logits == "filtered":  # SamplingParams filters: the filter-cut launches join the plan
        extra.update(top_k=seeds, top_p=torch.empty(B, device=META), min_p=torch.empty(B, device=META))
    return VerifyBatch.padded(target, bonus, draft, ids, seeds=seeds, offsets=seeds, **extra)


def _constexpr_names(kernel) -> set[str]:
    """Parameters annotated tl.constexpr (compiled JITFunction and interpreted kernels alike)."""
    fn = getattr(kernel, "fn", kernel)
    params = inspect.signature(fn).parameters.values()
    return {p.name for p in params if "constexpr" in str(p.annotation)}


def _variants(batch_sizes, ks, V, logits):
    """(kernel name, flag constexprs) -> set of (block sizes, num_warps) its launches used."""
    seen: dict[str, set] = defaultdict(set)
    for k in ks:
        for B in batch_sizes:
            batch = _batch(B, k, V, logits)
            split = plan_vocab_split(V, B, 4 * SMS, 1024)
            launches = plan_verify(batch, REJECTION, split)[0] + plan_typical(batch, 0.09, 0.3, split)[0]
            launches += plan_verify(batch, BLOCK, split)[0]
            for launch in launches:
                constexpr_names = _constexpr_names(launch.kernel)
                flags = tuple(
                    sorted((n, v) for n, v in launch.args.items() if n in constexpr_names and not n.startswith("BLOCK"))
                )
                blocks = tuple(sorted((n, v) for n, v in launch.args.items() if n.startswith("BLOCK")))
                seen[(launch.name, flags)].add((blocks, launch.num_warps))
    return seen


def test_compiled_variants_stay_bounded_as_the_batch_size_changes():
    vocab_pass = {"residual_partials", "argmax_partials", "softmax_partials", "typical_partials", "block_partials"}
    vocab_pass |= {"filter_cut"}  # BLOCK_V from the vocabulary size alone: one variant
    for V in (32000, 128256, 152064):
        for logits in (False, True, "filtered"):
            fixed_k = _variants(range(1, 1025), [4], V, logits)
            for (name, _), variants in fixed_k.items():
                bound = len(BLOCK_V_CHOICES) if name in vocab_pass else MAX_VOCAB_BLOCKS.bit_length()
                assert len(variants) <= bound, (V, logits, name, len(variants))
            any_k = _variants(range(1, 1025, 7), range(1, 17), V, logits)
            for (name, _), variants in any_k.items():
                bound = 5 * (len(BLOCK_V_CHOICES) if name in vocab_pass else MAX_VOCAB_BLOCKS.bit_length())
                assert len(variants) <= bound, (V, logits, name, len(variants))


def test_launch_arguments_are_keywords_and_absent_tensors_are_none():
    batch = _batch(3, 2, 100, logits=False)
    batch = VerifyBatch.padded(batch.target, batch.bonus_token_ids, None, batch.draft_token_ids, seeds=batch.seeds)
    launches, _ = plan_verify(batch, REJECTION, plan_vocab_split(100, 3, 8, 1024))
    by_name = {launch.name: launch for launch in launches}
    # no greedy rows: no argmax pass; the last program per request finishes it (no finalize launch)
    assert set(by_name) == {"residual_partials"}
    args = by_name["residual_partials"].args
    assert args["arrivals"] is not None and args["out_ptr"] is not None
    # NamedTuple arguments (spec_samplers.kernels.abi): the kernels' flags (HAS_DRAFT,
    # HAS_OFFSETS, a greedy mask, LOGITS, RAGGED) are these None fields, specialised as constexprs
    seqs, req, parts = args["seqs"], args["req"], args["parts"]
    assert seqs.draft == Rows(None, 0, 0, None, None, None, None) and req.offsets is None and req.is_greedy is None
    assert req.temperature is None and parts.amax_val is None and parts.amax_idx is None and req.cu is None
    assert (seqs.target.stats, seqs.target.row_index, seqs.target.num_index_rows, seqs.target.temperature) == (
        None,
    ) * 4


def test_a_logits_request_carries_its_temperatures_and_no_greedy_mask():
    """Greedy requests of logits inputs are T == 0 (read from ``req.temperature``): ``is_greedy``
    never holds temperatures."""
    batch = _batch(3, 2, 100, logits=True)
    for plan in (plan_verify(batch, REJECTION, None)[0], plan_verify(batch, BLOCK, None)[0]):
        req = plan[-1].args["req"]
        assert req.temperature is batch.temperature and req.is_greedy is None


def _grouped(value):
    """The tuple arguments inside ``value``, nested ones included."""
    if isinstance(value, tuple):
        yield value
        for v in value:
            yield from _grouped(v)


def test_grouped_kernel_arguments_are_the_declared_named_tuples():
    """Every tuple a plan passes to a kernel is one of spec_samplers.kernels.abi's NamedTuples
    (its fields are what the kernels read by name: tests/kernel_compile_check.py compiles every
    variant with these classes in the signature, so a field read and not packed fails there)."""
    declared = {c for c in vars(abi).values() if isinstance(c, type) and issubclass(c, tuple)}
    for logits in (False, True, "filtered"):
        batch = _batch(3, 2, 100, logits)
        split = plan_vocab_split(100, 3, 8, 1024)
        launches = plan_verify(batch, REJECTION, split)[0] + plan_verify(batch, BLOCK, split)[0]
        launches += plan_typical(batch, 0.09, 0.3, split)[0]
        for launch in launches:
            if launch.name == "filter_cut":  # (the sampling kernels' own arguments: scalars and tensors)
                continue
            for name, value in launch.args.items():
                for t in _grouped(value):
                    assert type(t) in declared, (launch.name, name, type(t))


#: what a kernel calls its grouped arguments -> the abi classes such a name may hold
_NAMES = {
    "req": ("Request", "StatsRequest"),
    "rq": ("ProgramRequest",),
    "seqs": ("Seqs",),
    "parts": ("VerifyParts", "TypicalParts", "SoftmaxParts"),
    "target": ("Rows",),
    "draft": ("Rows",),
    "rows": ("Rows",),
    "ids": ("Ids",),
    "stats": ("Stats",),
    "posterior": ("Posterior",),
    "drafts": ("Drafts",),
    "rrow": ("ResidualRow",),
    "FLAGS": ("PassFlags",),
}


def test_kernels_read_only_declared_fields():
    """A static check of the kernels' sources (no compilation): each ``name.field`` they read of
    a grouped argument names a field of an abi class that argument can hold."""
    import re
    from pathlib import Path

    kernels = Path(abi.__file__).parent
    pattern = re.compile(r"\b(" + "|".join(_NAMES) + r")\.(\w+)")
    for module in ("verify_kernels", "rejection_kernels", "block_kernels", "typical_kernels", "softmax_kernels"):
        source = (kernels / f"{module}.py").read_text()
        reads = pattern.findall(source)
        assert reads, module
        for name, field in reads:
            fields = {f for cls in _NAMES[name] for f in getattr(abi, cls)._fields}
            assert field in fields, f"{module}: {name}.{field} is not a field of {_NAMES[name]}"


def test_a_launch_config_records_the_launches_for_its_device_without_running_them():
    """``backend.planned_for(LaunchConfig(...))``: the samplers' launchers append their planned
    launches to ``config.launches`` (meta tensors: nothing could run) with the split of a GPU of
    ``config.num_sms`` multiprocessors."""
    from spec_samplers import BlockVerificationSampler, RejectionSampler, TypicalAcceptanceSampler
    from spec_samplers.kernels import backend

    B, k, V = 2, 3, 128256
    target, draft = torch.empty(B, k + 1, V, device=META), torch.empty(B, k, V, device=META)
    ids = torch.empty(B, k, dtype=torch.int64, device=META)
    args = (target, torch.empty(B, 1, dtype=torch.int64, device=META), draft, ids)
    seeds = torch.empty(B, dtype=torch.int64, device=META)
    expected = plan_vocab_split(V, B, 4 * SMS, 1024, wide_steps=True)
    for sampler, name, kw in (
        (RejectionSampler(), "residual_partials", {"seeds": seeds}),
        (BlockVerificationSampler(), "block_partials", {"seeds": seeds}),
        (TypicalAcceptanceSampler(), "typical_partials", {}),
    ):
        config = backend.LaunchConfig(num_sms=SMS, kernels=True, launches=[])
        with backend.planned_for(config):
            out = sampler(*args, **kw)
        assert out.device == META and out.shape == (B, k + 1)
        launch = next(launch for launch in config.launches if launch.name == name)
        # (typical's partials run (B, k+1, NB) programs: their split is sized by B * (k+1) rows)
        split = expected if name != "typical_partials" else plan_vocab_split(V, B * (k + 1), 4 * SMS, 1024)
        assert launch.args["chunk"] == split.chunk and launch.args["BLOCK_V"] == split.block_v, name


def test_a_plan_keeps_its_workspaces_per_shape_and_allocates_only_its_output():
    """Issue 40, a plan cached per shape: two calls of one shape share their partials, race sums
    and statistics (backend.workspaces: launches on one stream run in order), each gets
    its own output; another k gets workspaces of its own sizes."""
    for logits in (False, True):
        (first, out_a), (second, out_b) = (plan_verify(_batch(3, 2, 1000, logits), REJECTION, None) for _ in range(2))
        assert out_a is not out_b
        for a, b in zip(first, second):
            for name in ("parts", "stats"):
                if name in a.args:
                    assert all(x is y for x, y in zip(a.args[name], b.args[name])), (logits, name)
        other = plan_verify(_batch(3, 4, 1000, logits), REJECTION, None)[0][-1].args["parts"]
        assert other.amax_val.shape[1] == 5 and other.amax_val is not first[-1].args["parts"].amax_val
