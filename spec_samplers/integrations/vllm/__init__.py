"""vLLM 0.32 and 0.33 plugin: ``additional_config={"spec_samplers": {"acceptance_method": NAME, **options}}``
replaces vLLM's verification step with a sampler from our registry, in both model runners.

Entry point (pyproject.toml): ``vllm.general_plugins`` -> ``spec_samplers.integrations.vllm:register``.
Importing this package imports no part of vLLM.
"""

from spec_samplers.integrations.vllm.plugin import SEAMS, configure_seam, installed, register

__all__ = ["SEAMS", "configure_seam", "installed", "register"]
