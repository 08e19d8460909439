"""Run the Triton kernels through the interpreter on machines without CUDA (CI)."""

import os

import torch

if not torch.cuda.is_available():
    # Must be set before anything imports triton.
    os.environ.setdefault("TRITON_INTERPRET", "1")
