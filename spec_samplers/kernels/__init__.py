"""Triton kernels and their launchers (no engine imports).

Modules: ``rng`` (counter RNG mirrored bit for bit), ``common`` (layout addressing, cleaning,
partial combination, fused-softmax row statistics), ``verify_kernels`` (what rejection sampling
and block verification share), ``rejection_kernels``, ``block_kernels``, ``typical_kernels``,
``softmax_kernels`` (fused softmax of logits inputs); ``verify_plan`` (the one planning module of
the verification launches), ``abi`` (the kernels' NamedTuple arguments), ``rejection_launch``,
``block_launch``, ``typical_launch`` (the launchers: plan, then launch), ``launch_common``
(planned launches, arrival counters), ``backend`` (which backend runs a call, vocabulary split).
Importing this package does not import triton; a launcher imports its plan and kernels when it
runs.
"""
