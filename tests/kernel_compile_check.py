"""Compile every kernel variant for sm_90 without a GPU (Triton frontend, LLVM, PTX, the bundled
ptxas), catching what the interpreter cannot: compiled-mode typing, libdevice calls, i1 pointers.

Run as a script with TRITON_INTERPRET unset (tests/test_kernels_compile.py does that)."""
import os
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from spec_samplers.kernels import rejection_kernels as rk, softmax_kernels as sk, typical_kernels as tk

target = GPUTarget("cuda", 90, 32)

def sig(fn, types, constexprs):
    names = fn.arg_names
    s = {}
    for n in names:
        if n in constexprs:
            s[n] = "constexpr"
        else:
            s[n] = types.get(n, "i32")
    return s

def compile_kernel(fn, ptrs, consts, extra_types={}):
    types = {n: t for n, t in ptrs.items()}
    types.update(extra_types)
    s = sig(fn, types, consts)
    src = ASTSource(fn=fn, signature=s, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
    k = triton.compile(src, target=target)
    return k

P = lambda dt: f"*{dt}"  # noqa: E731
for ragged in (False, True):
  for logits in (False, True):
    for has_draft in (False, True):
        common_ptrs = dict(target_ptr=P("bf16"), draft_ptr=P("bf16"), ids_ptr=P("i64"), bonus_ptr=P("i32"),
                           cu_ptr=P("i64"), seed_ptr=P("i64"), offset_ptr=P("i64"), greedy_ptr=P("i1"),
                           part_mass_ptr=P("fp32"), part_rkey_ptr=P("fp32"), part_ridx_ptr=P("i32"),
                           part_qkey_ptr=P("fp32"), part_qidx_ptr=P("i32"), part_qmax_ptr=P("fp32"), temp_ptr=P("fp32"),
                           t_max_ptr=P("fp32"), t_sum_ptr=P("fp32"), d_max_ptr=P("fp32"), d_sum_ptr=P("fp32"),
                           amax_val_ptr=P("fp32"), amax_idx_ptr=P("i32"), out_ptr=P("i64"))
        flags = dict(RAGGED=ragged, HAS_DRAFT=has_draft, HAS_OFFSETS=True, HAS_GREEDY=True, LOGITS=logits, PRECISE=True)
        compile_kernel(rk.residual_partials_kernel, common_ptrs, dict(flags, BLOCK_K=8, BLOCK_V=1024))
        compile_kernel(rk.finalize_kernel, common_ptrs, dict(flags, BLOCK_K=16, BLOCK_NB=64))
        sp = dict(target_ptr=P("fp32"), draft_ptr=P("fp32"), cu_ptr=P("i64"), temp_ptr=P("fp32"), t_m_ptr=P("fp32"), t_s_ptr=P("fp32"),
                  d_m_ptr=P("fp32"), d_s_ptr=P("fp32"), amax_val_ptr=P("fp32"), amax_idx_ptr=P("i32"))
        compile_kernel(sk.softmax_partials_kernel, sp, dict(RAGGED=ragged, HAS_DRAFT=has_draft, BLOCK_V=1024, PRECISE=True))
        sc = dict(cu_ptr=P("i64"), temp_ptr=P("fp32"), t_m_ptr=P("fp32"), t_s_ptr=P("fp32"), d_m_ptr=P("fp32"), d_s_ptr=P("fp32"),
                  t_max_ptr=P("fp32"), t_sum_ptr=P("fp32"), d_max_ptr=P("fp32"), d_sum_ptr=P("fp32"))
        compile_kernel(sk.softmax_combine_kernel, sc, dict(RAGGED=ragged, HAS_DRAFT=has_draft, BLOCK_K=16, BLOCK_NB=64, PRECISE=True))
    compile_kernel(rk.argmax_partials_kernel, dict(target_ptr=P("fp16"), cu_ptr=P("i32"), greedy_ptr=P("i1"), part_val_ptr=P("fp32"), part_idx_ptr=P("i32")),
                   dict(RAGGED=ragged, BLOCK_V=1024))
    tp = dict(target_ptr=P("fp32"), cu_ptr=P("i64"), temp_ptr=P("fp32"), t_max_ptr=P("fp32"), t_sum_ptr=P("fp32"),
              ent_ptr=P("fp32"), amax_val_ptr=P("fp32"), amax_idx_ptr=P("i32"), ids_ptr=P("i32"), bonus_ptr=P("i64"),
              lamax_val_ptr=P("fp32"), lamax_idx_ptr=P("i32"), out_ptr=P("i64"))
    compile_kernel(tk.typical_partials_kernel, tp, dict(RAGGED=ragged, LOGITS=logits, BLOCK_V=1024, PRECISE=True))
    compile_kernel(tk.typical_finalize_kernel, tp, dict(RAGGED=ragged, LOGITS=logits, BLOCK_K=16, BLOCK_NB=64, PRECISE=True),
                   dict(posterior_threshold="fp32", posterior_alpha="fp32"))
print("compiled all kernel variants for sm_90")
