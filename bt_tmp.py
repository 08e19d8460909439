import time, torch
import spec_samplers.sampling as s
torch.set_num_threads(1)
B,V=16,128256
probs = torch.softmax(torch.randn(B,V)*3,-1)
def t(f, n=3):
    f(); t0=time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter()-t0)/n*1e3
print('sampling_from_probs', t(lambda: s.sampling_from_probs(probs, seed=1, offset=0)))
print('top_k', t(lambda: s.top_k_sampling_from_probs(probs, 50, seed=1, offset=0)))
print('top_p', t(lambda: s.top_p_sampling_from_probs(probs, 0.9, seed=1, offset=0)))
print('top_k_renorm', t(lambda: s.top_k_renorm_probs(probs, 50)))
print('torch sort', t(lambda: torch.sort(probs, -1, descending=True)))
print('torch topk', t(lambda: torch.topk(probs, 50)))
from spec_samplers import rng_sampling
print('exps', t(lambda: rng_sampling.sample_exponentials(torch.arange(B), torch.zeros(B,dtype=torch.long), V)))
