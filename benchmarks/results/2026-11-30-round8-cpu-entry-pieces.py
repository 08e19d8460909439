"""Per-piece host costs of a warm B = 1 verify call (round 8, issue 37): thread CPU time, us per
call, the least of 20 blocks of 200 calls each (what a piece costs when nothing preempts it).

A record of how benchmarks/results/2026-11-30-round8-cpu-entry.md was measured, not a maintained
benchmark: it reads private names of the tree on PYTHONPATH (before and after the round), e.g.

    PYTHONPATH=/path/to/tree python benchmarks/results/2026-11-30-round8-cpu-entry-pieces.py [V] [B]
"""
import statistics, sys, time, functools
import numpy as np
import torch
torch.set_num_threads(1)
from spec_samplers.registry import get_sampler
from spec_samplers import base, cpu
from spec_samplers.layout import VerifyBatch, RowLayout
import os
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cpu_floor import far_batch, K

V = int(sys.argv[1]) if len(sys.argv) > 1 else 32000
B = int(sys.argv[2]) if len(sys.argv) > 2 else 1
N = 4000
CLK = time.thread_time

def t(fn, n=N, blocks=20):
    fn()
    meds = []
    for _ in range(blocks):
        t0 = CLK()
        for _ in range(n // blocks):
            fn()
        meds.append((CLK() - t0) / (n // blocks) * 1e6)
    return min(meds)

target, draft, ids, bonus, seeds = (x[:B] for x in far_batch(B, V))
res = {}
for name in ("rejection_sampler", "typical_acceptance_sampler"):
    s = get_sampler(name, backend="auto")
    extra = {"seeds": seeds} if name.startswith("rej") else {}
    s(target, bonus, draft, ids, **extra)
    r = {}
    r["whole s(...)"] = t(lambda: s(target, bonus, draft, ids, **extra))
    r["s.forward(...)"] = t(lambda: s.forward(target, bonus, draft, ids, **extra))
    # the batch as _run builds it
    prepared = next(iter(s._prepared.values()))
    layout = prepared.layout
    counters = s._counter_slots(K, target.device) if prepared.kernel_counts else None
    sd = seeds if extra else None
    mk = lambda: VerifyBatch(layout, target, draft, ids, bonus.reshape(B), seeds=sd, offsets=None, is_greedy=None,
                             temperature=None, draft_rows=None, draft_temperature=None, draft_is_probs=False, counters=counters)
    batch = mk()
    r["VerifyBatch(...)+reshape"] = t(mk)
    r["bonus.reshape(B)"] = t(lambda: bonus.reshape(B))
    host = (None, True, True, True, None, s.backend)
    tensors = (target, bonus, draft, ids, None, None, None, None, None, sd, None)
    r["_call_key"] = t(lambda: base._call_key(host, tensors))
    r["_prepared.get"] = t(lambda: s._prepared.get(base._call_key(host, tensors))) - r["_call_key"]
    r["_counter_slots"] = t(lambda: s._counter_slots(K, target.device))
    r["launch_config()"] = t(lambda: base.launch_config())
    opts = s._options
    R = base.Randomness(None, sd, None, None) if extra else None
    r["s._run(...)"] = t(lambda: s._run("forward", target, bonus, draft, ids, randomness=R))
    r["prepared.op(batch)"] = t(lambda: prepared.op(batch, **opts))
    if extra:
        r["rejection_cpu(batch)"] = t(lambda: cpu.rejection_cpu(batch))
    else:
        r["typical_cpu(batch)"] = t(lambda: cpu.typical_cpu(batch, **opts))
    sampler_name = "rejection sampling" if extra else None
    if hasattr(cpu, "_in_place"):
        r["_in_place (new)"] = t(lambda: cpu._in_place(batch, sampler_name))
    else:
        r["_Rows"] = t(lambda: cpu._Rows(batch, sampler_name))
    r["_counts"] = t(lambda: cpu._counts(batch))
    k = cpu.kernels()
    out = np.empty((B, K + 1), dtype=np.int64)
    r["np.empty"] = t(lambda: np.empty((B, K + 1), dtype=np.int64))
    r["from_numpy"] = t(lambda: torch.from_numpy(out))
    r["target.numpy()"] = t(lambda: target.numpy())
    tn = target.numpy().reshape(-1, V); dn = draft.numpy().reshape(-1, V)
    from types import SimpleNamespace
    plan = SimpleNamespace(target_rows=np.arange(B * (K + 1)).reshape(B, K + 1), draft_rows=np.arange(B * K).reshape(B, K),
                           num_draft=np.full(B, K), no_greedy=np.zeros(B, np.bool_), zero_offsets=np.zeros(B, np.uint64))
    di = ids.numpy(); bn = bonus.reshape(B).numpy(); sn = seeds.numpy().view(np.uint64)
    cnt, _ = cpu._counts(batch)
    if extra:
        kargs = (tn, plan.target_rows, dn, plan.draft_rows, True, di, plan.num_draft, bn, plan.no_greedy, False, sn, plan.zero_offsets, out, cnt, True)
        kern = k.rejection_kernel
    else:
        fl = cpu._typical_floats(0.09, 0.3)
        kargs = (tn, plan.target_rows, di, plan.num_draft, bn, *fl, out, cnt, True)
        kern = k.typical_kernel
    r["kernel (numba call)"] = t(lambda: kern(*kargs))
    if hasattr(k, "rejection_padded"):
        if extra:
            pargs = (target.data_ptr(), draft.data_ptr(), ids.data_ptr(), bonus.data_ptr(), 0, seeds.data_ptr(), 0, B, K, V, out, cnt, True)
            r["*_padded kernel (new)"] = t(lambda: k.rejection_padded(*pargs))
        else:
            pargs = (target.data_ptr(), ids.data_ptr(), bonus.data_ptr(), B, K, V, *fl, out, cnt, True)
            r["*_padded kernel (new)"] = t(lambda: k.typical_padded(*pargs))
    # dispatch cost: same kernel on a tiny V (rows read ~nothing)
    res[name] = r
names = list(res["rejection_sampler"].keys()) + [k for k in res["typical_acceptance_sampler"] if k not in res["rejection_sampler"]]
print(f"V={V} B={B} load={open('/proc/loadavg').read().split()[:3]}")
print(f"{'piece':28} {'rejection':>10} {'typical':>10}")
for n in names:
    a = res["rejection_sampler"].get(n, float('nan')); b = res["typical_acceptance_sampler"].get(n, float('nan'))
    print(f"{n:28} {a:10.2f} {b:10.2f}")
