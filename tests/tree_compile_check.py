"""Compile the tree kernels (spec_samplers/kernels/tree_kernels.py) for sm_90 without a GPU, every
variant the launchers can reach: policy (independent, without replacement, point mass), greedy
mask or not, fp32 / bf16 rows, probabilities or logits (fused softmax), padded or ragged (int32
ids, no offsets); the typical kernel for both dtypes, both row kinds and both layouts; the block
(Traversal Verification) kernel for every policy, greedy mask and row kind, padded and ragged; the
request filters (logits rows with the (kept sum, cut) of tree_filter_cut_kernel, and that kernel,
padded and ragged, with and without draft rows). Catches
what the interpreter cannot (compiled-mode typing of the scalar walk). Run with TRITON_INTERPRET
unset (tests/test_tree_kernels.py does)."""

import itertools
import os

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
from kernel_compile_check import TYPES, compile_all, signature  # noqa: E402

from spec_samplers.kernels.backend import precise_math  # noqa: E402
from spec_samplers.kernels.sampling_kernels import search_block  # noqa: E402
from spec_samplers.kernels.tree_kernels import (  # noqa: E402
    block_tree_kernel,
    rejection_tree_kernel,
    tree_filter_cut_kernel,
    typical_tree_kernel,
)
from spec_samplers.kernels.tree_launch import TREE_BLOCK_D, TREE_BLOCK_V  # noqa: E402

META = torch.device("meta")
TYPES.setdefault(torch.int8, "i8")


def t(dtype):
    return torch.empty(4, dtype=dtype, device=META)


def main():
    compiled = []  # (kernel, signature, constexprs, options)
    i64, i32 = torch.int64, torch.int32
    dtypes = (torch.float32, torch.bfloat16)
    variants = [(*v, False) for v in itertools.product((0, 1, 2), (False, True), dtypes, (False, True))]
    # the ragged layout (int32 ids and spans, offsets absent) on both row kinds
    variants += [(0, False, dtype, logits, True) for dtype in dtypes for logits in (False, True)]
    variants = [(*v, False) for v in variants]
    # the request filters (logits rows read through their cuts): a draft and a point mass, ragged
    variants += [(0, False, torch.bfloat16, True, False, True), (2, True, torch.float32, True, False, True)]
    variants += [(0, False, torch.bfloat16, True, True, True)]
    for policy, greedy, dtype, logits, ragged, cuts in variants:
        ids = i32 if ragged else i64
        args = dict(
            target_ptr=t(dtype), stride_t=5000, draft_ptr=None if policy == 2 else t(dtype), stride_d=5000,
            tokens_ptr=t(ids), stride_tb=10, parents_ptr=t(ids), stride_pb=0, cu_ptr=t(ids) if ragged else None,
            num_tokens=20, seed_ptr=t(i64), offset_ptr=None if ragged else t(i64),
            greedy_ptr=t(torch.bool) if greedy else None, temp_ptr=t(torch.float32) if logits else None,
            cut_ptr=t(torch.float32) if cuts else None, d_cut_ptr=t(torch.float32) if cuts and policy != 2 else None,
            scratch_ptr=t(torch.float32), out_ptr=t(i64), nodes_ptr=t(i64), counts_ptr=t(i64),
            N=10, V=5000, max_depth=3,
            POLICY=policy, BLOCK_V=TREE_BLOCK_V, BLOCK_D=TREE_BLOCK_D, PRECISE=precise_math(),
        )  # fmt: skip
        compiled.append((rejection_tree_kernel, *signature(rejection_tree_kernel, args), None))
    typical = [(*v, False) for v in itertools.product((torch.float32, torch.bfloat16), (False, True), (False, True))]
    typical += [(torch.bfloat16, True, ragged, True) for ragged in (False, True)]
    for dtype, logits, ragged, cuts in typical:
        ids = i32 if ragged else i64
        args = dict(
            target_ptr=t(dtype), stride_t=5000, tokens_ptr=t(ids), stride_tb=10, parents_ptr=t(ids), stride_pb=10,
            cu_ptr=t(ids) if ragged else None, num_tokens=20, temp_ptr=t(torch.float32) if logits else None,
            cut_ptr=t(torch.float32) if cuts else None,
            stat_ptr=t(torch.float32) if logits else None, lidx_ptr=t(i64) if logits else None,
            thr_ptr=t(torch.float64), amax_ptr=t(i64), rowok_ptr=t(torch.int8), pdepth_ptr=t(i64),
            out_ptr=t(i64), nodes_ptr=t(i64), counts_ptr=t(i64), posterior_threshold=0.09, posterior_alpha=0.3,
            N=10, V=5000, max_depth=3, BLOCK_V=TREE_BLOCK_V, BLOCK_D=TREE_BLOCK_D, PRECISE=precise_math(),
        )  # fmt: skip
        compiled.append((typical_tree_kernel, *signature(typical_tree_kernel, args), None))
    # the block (Traversal Verification) kernel: every policy x greedy mask x row kind (fp32 rows
    # without a mask, bf16 with one), and the ragged layout (int32 ids, no offsets) on both row kinds
    block = [(*v, False) for v in itertools.product((0, 1, 2), (False, True), (False, True))]
    block += [(0, False, logits, True) for logits in (False, True)]
    block = [(*v, False) for v in block]
    block += [(0, False, True, False, True), (2, True, True, False, True), (1, False, True, True, True)]
    for policy, greedy, logits, ragged, cuts in block:
        ids = i32 if ragged else i64
        dtype = torch.bfloat16 if greedy or ragged else torch.float32
        args = dict(
            target_ptr=t(dtype), stride_t=5000, draft_ptr=None if policy == 2 else t(dtype), stride_d=5000,
            tokens_ptr=t(ids), stride_tb=10, parents_ptr=t(ids), stride_pb=0, cu_ptr=t(ids) if ragged else None,
            num_tokens=20, seed_ptr=t(i64), offset_ptr=None if ragged else t(i64),
            greedy_ptr=t(torch.bool) if greedy else None, temp_ptr=t(torch.float32) if logits else None,
            cut_ptr=t(torch.float32) if cuts else None, d_cut_ptr=t(torch.float32) if cuts and policy != 2 else None,
            q_ptr=t(torch.float32), nf_ptr=t(torch.float32), ni_ptr=t(i64),
            out_ptr=t(i64), nodes_ptr=t(i64), counts_ptr=t(i64), N=10, V=5000, max_depth=3,
            POLICY=policy, BLOCK_V=TREE_BLOCK_V, BLOCK_D=TREE_BLOCK_D, PRECISE=precise_math(),
        )  # fmt: skip
        compiled.append((block_tree_kernel, *signature(block_tree_kernel, args), dict(enable_fp_fusion=False)))
    # the filter cuts: padded / ragged (int32 spans), draft rows or none, fp32 / bf16 rows
    cut_variants = [(False, True, torch.float32), (True, True, torch.bfloat16), (False, False, torch.bfloat16)]
    for ragged, draft, dtype in cut_variants:
        args = dict(
            target_ptr=t(dtype), stride_t=5000, draft_ptr=t(dtype) if draft else None, stride_d=5000,
            cu_ptr=t(i32) if ragged else None, num_tokens=20, temp_ptr=t(torch.float32), top_k_ptr=t(i64),
            top_p_ptr=t(torch.float32), min_p_ptr=t(torch.float32), cut_ptr=t(torch.float32),
            d_cut_ptr=t(torch.float32) if draft else None, scratch_ptr=t(torch.float32),
            N=10, V=5000, cap=4096, BLOCK_V=search_block(5000), PRECISE=precise_math(),
        )  # fmt: skip
        compiled.append((tree_filter_cut_kernel, *signature(tree_filter_cut_kernel, args), None))
    compile_all(compiled)  # in parallel, one process per usable core
    print(f"compiled all tree kernel variants for sm_90: {len(compiled)} variants")


if __name__ == "__main__":
    main()
