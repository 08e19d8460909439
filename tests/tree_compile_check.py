"""Compile the tree kernels (spec_samplers/kernels/tree_kernels.py) for sm_90 without a GPU, every
variant the launchers can reach: policy (independent, without replacement, point mass), greedy
mask or not, fp32 / bf16 rows, probabilities or logits (fused softmax), padded or ragged (int32
ids, no offsets); the typical kernel for both dtypes, both row kinds and both layouts; the block
(Traversal Verification) kernel for every policy, greedy mask and row kind, padded and ragged. Catches
what the interpreter cannot (compiled-mode typing of the scalar walk). Run with TRITON_INTERPRET
unset (tests/test_tree_kernels.py does)."""

import itertools
import os

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
from kernel_compile_check import TYPES, compile_all, signature  # noqa: E402

from spec_samplers.kernels.backend import precise_math  # noqa: E402
from spec_samplers.kernels.tree_kernels import block_tree_kernel, rejection_tree_kernel, typical_tree_kernel  # noqa: E402
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
    for policy, greedy, dtype, logits, ragged in variants:
        ids = i32 if ragged else i64
        args = dict(
            target_ptr=t(dtype), stride_t=5000, draft_ptr=None if policy == 2 else t(dtype), stride_d=5000,
            tokens_ptr=t(ids), stride_tb=10, parents_ptr=t(ids), stride_pb=0, cu_ptr=t(ids) if ragged else None,
            num_tokens=20, seed_ptr=t(i64), offset_ptr=None if ragged else t(i64),
            greedy_ptr=t(torch.bool) if greedy else None, temp_ptr=t(torch.float32) if logits else None,
            scratch_ptr=t(torch.float32), out_ptr=t(i64), nodes_ptr=t(i64), counts_ptr=t(i64),
            N=10, V=5000, max_depth=3,
            POLICY=policy, BLOCK_V=TREE_BLOCK_V, BLOCK_D=TREE_BLOCK_D, PRECISE=precise_math(),
        )  # fmt: skip
        compiled.append((rejection_tree_kernel, *signature(rejection_tree_kernel, args), None))
    for dtype, logits, ragged in itertools.product((torch.float32, torch.bfloat16), (False, True), (False, True)):
        ids = i32 if ragged else i64
        args = dict(
            target_ptr=t(dtype), stride_t=5000, tokens_ptr=t(ids), stride_tb=10, parents_ptr=t(ids), stride_pb=10,
            cu_ptr=t(ids) if ragged else None, num_tokens=20, temp_ptr=t(torch.float32) if logits else None,
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
    for policy, greedy, logits, ragged in block:
        ids = i32 if ragged else i64
        dtype = torch.bfloat16 if greedy or ragged else torch.float32
        args = dict(
            target_ptr=t(dtype), stride_t=5000, draft_ptr=None if policy == 2 else t(dtype), stride_d=5000,
            tokens_ptr=t(ids), stride_tb=10, parents_ptr=t(ids), stride_pb=0, cu_ptr=t(ids) if ragged else None,
            num_tokens=20, seed_ptr=t(i64), offset_ptr=None if ragged else t(i64),
            greedy_ptr=t(torch.bool) if greedy else None, temp_ptr=t(torch.float32) if logits else None,
            q_ptr=t(torch.float32), nf_ptr=t(torch.float32), ni_ptr=t(i64),
            out_ptr=t(i64), nodes_ptr=t(i64), counts_ptr=t(i64), N=10, V=5000, max_depth=3,
            POLICY=policy, BLOCK_V=TREE_BLOCK_V, BLOCK_D=TREE_BLOCK_D, PRECISE=precise_math(),
        )  # fmt: skip
        compiled.append((block_tree_kernel, *signature(block_tree_kernel, args), dict(enable_fp_fusion=False)))
    compile_all(compiled)  # in parallel, one process per usable core
    print(f"compiled all tree kernel variants for sm_90: {len(compiled)} variants")


if __name__ == "__main__":
    main()
