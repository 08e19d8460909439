"""(d) a bad section stops the engine at start with our message: raised in the worker's process
while it builds its model runner, logged there (vLLM logs to stdout), and the engine does not
start (vLLM's client raises that a background process failed)."""

from __future__ import annotations

import pytest

from spec_samplers.certify.vllm_engine import EngineSpec, VllmEngine


@pytest.mark.parametrize(
    ("sampler", "options", "message"),
    [
        ("no_such_sampler", {}, "no_such_sampler"),
        ("typical_acceptance_sampler", {"posterior_threshold": "high"}, "rejected its options"),
    ],
)
def test_bad_section_fails_at_engine_start(pair, capfd, sampler, options, message):
    with pytest.raises(Exception, match="initialization failed"):
        VllmEngine(EngineSpec(pair.target, sampler=sampler, sampler_options=options))
    captured = capfd.readouterr()
    logs = captured.out + captured.err
    assert "SpecSamplersConfigError: additional_config['spec_samplers']" in logs, logs[-3000:]
    assert message in logs
