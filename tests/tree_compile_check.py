"""Compile the tree kernels (spec_samplers/kernels/tree_kernels.py) for sm_90 without a GPU, every
variant the launchers can reach: policy (independent, without replacement, point mass), greedy
mask or not, fp32 / bf16 rows, probabilities or logits (fused softmax); the typical kernel for
both dtypes. Catches what the interpreter cannot (compiled-mode typing of the scalar walk). Run
with TRITON_INTERPRET unset (tests/test_tree_kernels.py does)."""

import itertools
import os

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from kernel_compile_check import TARGET, TYPES, signature  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from spec_samplers.kernels.launch_common import precise_math  # noqa: E402
from spec_samplers.kernels.tree_kernels import rejection_tree_kernel, typical_tree_kernel  # noqa: E402
from spec_samplers.kernels.tree_launch import TREE_BLOCK_V  # noqa: E402

META = torch.device("meta")
TYPES.setdefault(torch.int8, "i8")


def t(dtype):
    return torch.empty(4, dtype=dtype, device=META)


def main():
    count = 0
    i64 = torch.int64
    for policy, greedy, dtype, logits in itertools.product(
        (0, 1, 2), (False, True), (torch.float32, torch.bfloat16), (False, True)
    ):
        args = dict(
            target_ptr=t(dtype), stride_t=5000, draft_ptr=None if policy == 2 else t(dtype), stride_d=5000,
            rows_ptr=t(i64), drows_ptr=t(i64), tokens_ptr=t(i64), parents_ptr=t(i64), depth_ptr=t(i64),
            seed_ptr=t(i64), offset_ptr=t(i64), greedy_ptr=t(torch.bool) if greedy else None,
            scratch_ptr=t(torch.float32), resid_ptr=t(torch.float32), stop_ptr=t(i64), qok_ptr=t(torch.int8),
            amax_ptr=t(i64), temp_ptr=t(torch.float32) if logits else None, N=10, V=5000, max_depth=3,
            POLICY=policy, BLOCK_V=TREE_BLOCK_V, PRECISE=precise_math(),
        )  # fmt: skip
        sig, consts = signature(rejection_tree_kernel, args)
        triton.compile(ASTSource(fn=rejection_tree_kernel, signature=sig, constexprs=consts), target=TARGET)
        count += 1
    for dtype in (torch.float32, torch.bfloat16):
        args = dict(
            target_ptr=t(dtype), stride_t=5000, rows_ptr=t(i64), tokens_ptr=t(i64), parents_ptr=t(i64),
            depth_ptr=t(i64), thr_ptr=t(torch.float64), amax_ptr=t(i64), rowok_ptr=t(torch.int8),
            pass_ptr=t(torch.int8), stop_ptr=t(i64), final_ptr=t(i64), posterior_threshold=0.09,
            posterior_alpha=0.3, N=10, V=5000, max_depth=3, BLOCK_V=TREE_BLOCK_V, PRECISE=precise_math(),
        )  # fmt: skip
        sig, consts = signature(typical_tree_kernel, args)
        triton.compile(ASTSource(fn=typical_tree_kernel, signature=sig, constexprs=consts), target=TARGET)
        count += 1
    print(f"compiled all tree kernel variants for sm_90: {count} variants")


if __name__ == "__main__":
    main()
