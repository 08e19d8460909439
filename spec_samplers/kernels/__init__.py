"""Triton kernels and their launchers (no engine imports).

Modules: ``rng`` (counter RNG mirrored bit for bit), ``common`` (layout addressing, cleaning,
partial combination), ``rejection_kernels`` / ``rejection_launch``, ``typical_kernels`` /
``typical_launch``, ``softmax_kernels`` / ``launch_common`` (fused softmax of logits inputs),
``backend`` (which backend runs a call, vocabulary split). Importing this package does not
import triton; the samplers import the launchers only when the Triton backend is chosen.
"""
