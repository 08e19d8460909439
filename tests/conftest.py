"""Shared fixtures. Tests run on CPU; samplers are exercised on whatever device is given."""

import pytest
import torch


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)
