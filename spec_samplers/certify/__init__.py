"""``spec-samplers certify``: does a speculative decoding setup keep the target's law, end to end?

* :mod:`spec_samplers.certify.law`: the target's exact law of the first m generated tokens
  (computed with the target model, non-speculatively) and the test of N samples against it.
* :mod:`spec_samplers.certify.tiny_models`: the tiny target/draft pair built when no model is given.

Nothing here is imported by ``import spec_samplers``; transformers is needed for the law.
"""

from spec_samplers.certify.law import (
    Cell,
    LawTest,
    TargetLaw,
    Verdict,
    check_samples,
    samples_needed,
    target_law,
    target_laws,
)

__all__ = [
    "Cell",
    "LawTest",
    "TargetLaw",
    "Verdict",
    "check_samples",
    "samples_needed",
    "target_law",
    "target_laws",
]
