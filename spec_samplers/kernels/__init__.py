"""Triton kernels and their launchers (no engine imports).

Modules: ``rng`` (counter RNG mirrored bit for bit), ``common`` (layout addressing, cleaning,
partial combination, fused-softmax row statistics), ``verify_kernels`` (what rejection sampling
and block verification share), ``rejection_kernels``, ``block_kernels``, ``typical_kernels``,
``softmax_kernels`` (fused softmax of logits inputs); ``verify_launch`` (the verification
launchers and their one plan: rejection, block, typical), ``abi`` (the kernels' NamedTuple
arguments), ``backend`` (which backend runs a call, vocabulary split, what every launcher shares:
planned launches and the recording hook, plans and workspaces per shape and stream, arrival
counters).
Importing this package does not import triton; a launcher imports its plan and kernels when it
runs.
"""
