"""The seed's KVCache semantics on both cache kinds, per-request crops, and the lazy transformers import."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from spec_samplers.decoding import KVCache, KVState, TensorKVCache

B, H, D = 3, 2, 4


def states(num_tokens: int, layers: int = 2, start: float = 0.0) -> list[KVState]:
    """Keys whose value is the token's index (start + t), so gathers are easy to check."""
    t = start + torch.arange(num_tokens, dtype=torch.float32)
    keys = t[None, None, :, None].expand(B, H, num_tokens, D).clone()
    return [KVState(keys + layer, -(keys + layer)) for layer in range(layers)]


def test_update_crop_and_states_follow_the_seed():
    cache = TensorKVCache()
    assert isinstance(cache, KVCache)
    assert cache.get_kv_states() == [] and cache.get_num_tokens() == 0
    cache.crop(0)
    with pytest.raises(ValueError, match="num_tokens_crop"):
        cache.crop(1)
    cache.update(states(5))
    cache.update(states(2, start=5))
    assert cache.get_num_tokens() == 7
    cache.crop(3)
    kv = cache.get_kv_states()
    assert len(kv) == 2 and kv[0].keys.shape == (B, H, 4, D)
    assert kv[0].keys[0, 0, :, 0].tolist() == [0, 1, 2, 3] and torch.equal(kv[1].values, -(kv[0].keys + 1))
    for bad in (-1, 5):
        with pytest.raises(ValueError, match=r"num_tokens_crop: expected an int in \[0, 4\]"):
            cache.crop(bad)
    assert cache.get_num_tokens() == 4  # a refused crop changes nothing


def test_update_validation():
    cache = TensorKVCache()
    with pytest.raises(ValueError, match="kv_states"):
        cache.update([])
    k = torch.zeros(B, H, 2, D)
    with pytest.raises(ValueError, match=r"kv_states\[0\]"):
        cache.update([KVState(k, torch.zeros(B, H, 3, D))])
    cache.update(states(2))
    with pytest.raises(ValueError, match="2 KVStates"):
        cache.update(states(1, layers=3))
    with pytest.raises(ValueError, match=r"kv_states\[1\]"):
        cache.update([KVState(k, k), KVState(torch.zeros(B, H + 1, 2, D), torch.zeros(B, H + 1, 2, D))])


def test_per_request_crops_leave_holes_that_compaction_removes():
    cache = TensorKVCache()
    cache.update(states(6))
    cache.crop([1, 4, 0])  # lengths 5, 2, 6
    assert cache.get_num_tokens_per_request() == [5, 2, 6] and cache.get_num_tokens() == 6
    cache.update(states(2, start=10))  # request 1 now has a hole of 4 slots
    assert cache.get_num_tokens_per_request() == [7, 4, 8]
    layout = cache.query_layout(torch.tensor([[1, 2], [-1, 3], [4, 5]]))
    assert layout.position_ids.tolist() == [[7, 8], [3, 4], [8, 9]]  # padding does not advance positions
    assert layout.attention_mask[1].tolist() == [1, 1, 0, 0, 0, 0, 1, 1, 0, 1]
    with pytest.raises(ValueError, match=r"num_tokens_crop\[1\]: expected an int in \[0, 4\]"):
        cache.crop([0, 5, 0])
    with pytest.raises(ValueError, match="num_tokens_crop"):
        cache.crop([1, 1])
    kv = cache.get_kv_states()  # compacted: each request's tokens at the right end
    mask = cache.attention_mask()
    assert kv[0].keys.shape[2] == 8 and mask.sum(1).tolist() == [7, 4, 8]
    assert kv[0].keys[1, 0, mask[1], 0].tolist() == [0, 1, 10, 11]
    assert kv[0].keys[0, 0, mask[0], 0].tolist() == [0, 1, 2, 3, 4, 10, 11]
    cache.batch_select_indices(torch.tensor([2, 1]))
    assert cache.get_num_tokens_per_request() == [8, 4] and cache.batch_size == 2


def test_hf_cache_crops_per_request():
    from spec_samplers.integrations.transformers import HFKVCache

    cache = HFKVCache()
    assert isinstance(cache, KVCache) and cache.get_kv_states() == []
    cache.update(states(5))
    cache.crop([2, 0, 5])
    assert cache.get_num_tokens_per_request() == [3, 5, 0]
    assert cache.cache.get_seq_length() == 5  # request 1 still needs every slot
    cache.crop(0)
    with pytest.raises(ValueError, match=r"num_tokens_crop\[2\]"):
        cache.crop([0, 0, 1])
    kv = cache.get_kv_states()
    assert kv[1].keys[0, 0, cache.attention_mask()[0], 0].tolist() == [1.0, 2.0, 3.0]  # layer 1 = index + 1


def test_missing_transformers_gives_a_clear_error():
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "import spec_samplers, spec_samplers.decoding, spec_samplers.integrations.transformers as t\n"
        "try:\n    t.HFKVCache()\nexcept ImportError as e:\n    print(e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "needs the transformers package (>= 4.56)" in result.stdout
    assert "pip install -e '.[transformers]'" in result.stdout
