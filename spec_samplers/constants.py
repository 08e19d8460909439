"""Constants shared by the PyTorch references, the Triton kernels and the engine adapters, and the
package's error type.

Dependency-free on purpose: every layer may import it, so a value lives here once.
"""

import struct


def fp32_value(x: float) -> float:
    """x rounded to the nearest fp32 value (kernels receive float options as fp32; the PyTorch
    references round the same options the same way)."""
    try:
        return float(struct.unpack("f", struct.pack("f", x))[0])
    except OverflowError:  # beyond the fp32 range: fp32 rounds it to infinity
        return x * float("inf")


# --- the shared logits rule (spec_samplers.torch_ops.scaled_exp and its kernel twin) ---

#: log2(e) rounded to fp32: the rule's per-row scale is c = LOG2E_FP32 / T, one IEEE fp32 division
LOG2E_FP32 = fp32_value(1.4426950408889634)
#: the lightest weight the rule keeps, the smallest normal fp32 (2**-126); lighter weights are 0, so
#: the rule's exp2 matters only where it is normal: there CUDA's exp2f (torch.exp2) and the kernels'
#: ex2 are the same single MUFU.EX2 (they differ on subnormal results, which exp2f rescales and
#: Triton's libdevice, under its default FTZ, flushes)
WEIGHT_MIN = 2.0**-126

#: marks the output slots after the emitted tokens (vLLM's PLACEHOLDER_TOKEN_ID)
PLACEHOLDER_TOKEN_ID = -1

#: a residual (q - p)+ whose mass is at most this is rounding noise: recover from q instead
RESIDUAL_MASS_EPS = 1e-6

#: Medusa's and vLLM V0's epsilon inside the entropy's log, H = -sum q log(q + eps)
ENTROPY_EPS = 1e-5
#: ENTROPY_EPS as the fp32 value both backends add (V0 adds it to fp32 probabilities)
ENTROPY_EPS_FP32 = fp32_value(ENTROPY_EPS)

#: seeds drawn for unseeded rows lie in [0, SEED_HIGH) (spec_samplers.rng.row_seeds and the
#: sampling operations' seed=None)
SEED_HIGH = 2**62

#: largest ``max_spec_len`` the ragged entries accept: the kernels hold a request's positions in
#: one vector, and no speculative method drafts more tokens per step
MAX_SPEC_LEN = 1024

# --- FlashInfer-compatible sampling operations (spec_samplers.sampling) ---

#: fixed-point resolution of the sampling filters' masses: a weight w counts as
#: round(min(w, 1) * 2**SAMPLING_MASS_BITS) int64 units, so mass sums are exact and order-free
SAMPLING_MASS_BITS = 40
#: int64 mass sums cannot overflow below this vocabulary size (V * 2**SAMPLING_MASS_BITS < 2**63)
SAMPLING_MAX_VOCAB_SIZE = 2 ** (63 - SAMPLING_MASS_BITS)
#: the largest finite fp32, which +inf logits become in the sampling operations
FLOAT32_MAX = 3.4028234663852886e38


# --- the error every argument check raises ---


class SpecSamplerInputError(ValueError, AssertionError):
    """Bad sampler input.

    Derives from ValueError (what new code should catch) and AssertionError (what code written
    against vLLM V0's strict-mode asserts catches).
    """


def input_error(argument: str, expected: str, actual: object) -> SpecSamplerInputError:
    """Error naming the argument, what was expected and what was given."""
    return SpecSamplerInputError(f"{argument}: expected {expected}, got {actual}")
