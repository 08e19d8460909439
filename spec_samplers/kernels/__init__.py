"""Triton kernels and their launchers (no engine imports).

Modules: ``rng`` (counter RNG mirrored bit for bit), ``common`` (layout addressing, cleaning,
partial combination, fused-softmax row statistics), ``verify_kernels`` / ``verify_launch`` (what
rejection sampling and block verification share), ``rejection_kernels`` / ``rejection_launch``,
``block_kernels`` / ``block_launch``, ``typical_kernels`` / ``typical_launch``,
``softmax_kernels`` / ``launch_common`` (fused softmax of logits inputs, planned launches),
``backend`` (which backend runs a call, vocabulary split). Importing this package does not
import triton; the samplers import the launchers only when the Triton backend is chosen.
"""
