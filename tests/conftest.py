"""Shared fixtures. Tests run on CPU; samplers are exercised on whatever device is given.

Without CUDA, the Triton kernels run through the interpreter (TRITON_INTERPRET=1), which must be
set before anything imports triton."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)
