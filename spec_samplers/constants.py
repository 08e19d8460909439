"""Constants shared by the PyTorch references, the Triton kernels and the engine adapters.

Dependency-free on purpose: every layer may import it, so a value lives here once.
"""

#: marks the output slots after the emitted tokens (vLLM's PLACEHOLDER_TOKEN_ID)
PLACEHOLDER_TOKEN_ID = -1

#: a residual (q - p)+ whose mass is at most this is rounding noise: recover from q instead
RESIDUAL_MASS_EPS = 1e-6

#: Medusa's and vLLM V0's epsilon inside the entropy's log, H = -sum q log(q + eps)
ENTROPY_EPS = 1e-5
