"""The vLLM plugin's registration and configuration, with the real vLLM 0.33 (CPU; 0.32 through
.ci/check_vllm_032)."""

from __future__ import annotations

import json
import logging
import sys
from importlib.metadata import entry_points

import pytest
import torch
import vllm_support  # noqa: F401  (sets VLLM_TARGET_DEVICE before vLLM picks a platform)
from vllm_support import (
    V1_MODULE,
    V2_MODULE,
    VLLM_033,
    engine_config,
    is_vllm_function,
    make_model_dir,
    ngram_spec,
    restore_seams,  # noqa: F401  (fixture)
    seam_module,
)

import spec_samplers.integrations.vllm as plugin
from spec_samplers.block import BlockVerificationSampler
from spec_samplers.integrations.vllm import plugin as plugin_impl
from spec_samplers.integrations.vllm.config import SpecSamplersConfigError, choice_from_vllm_config
from spec_samplers.typical import TypicalAcceptanceSampler


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("tiny-llama"))


def cli_engine_config(model_dir: str, additional_config_json: str):
    """A real VllmConfig parsed from `vllm serve`-style arguments."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(
        [
            "--model",
            model_dir,
            "--skip-tokenizer-init",
            "--max-model-len",
            "128",
            "--speculative-config",
            json.dumps(ngram_spec()),
            "--additional-config",
            additional_config_json,
        ]
    )
    return EngineArgs.from_cli_args(args).create_engine_config()


def build_vllm_rejection_samplers(vllm_config):
    """Construct both runners' RejectionSampler the way their model runners do: inside
    set_current_vllm_config (our observer reads the config there)."""
    from vllm.config import set_current_vllm_config

    v1, v2 = seam_module(V1_MODULE), seam_module(V2_MODULE)
    with set_current_vllm_config(vllm_config):
        if VLLM_033:  # 0.33's V1 model runner passes the speculative config and device too
            v1.RejectionSampler(_BonusSamplerStub(), vllm_config.speculative_config, torch.device("cpu"))
        else:
            v1.RejectionSampler(_BonusSamplerStub())
        v2.RejectionSampler(None, vllm_config.speculative_config, torch.device("cpu"))
    return v1, v2


class _BonusSamplerStub(torch.nn.Module):
    """vLLM's V1 Sampler needs vllm._C (GPU build) to run; the constructor only reads these."""

    logprobs_mode = "raw_logprobs"


def test_entry_point_is_declared():
    (ep,) = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "spec_samplers"]
    assert ep.value == "spec_samplers.integrations.vllm:register"


def test_vllm_loader_discovers_and_runs_register(monkeypatch):
    import vllm.plugins

    calls = []
    real_register = plugin.register
    monkeypatch.setattr(plugin, "register", lambda: calls.append(1) or real_register())
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    vllm.plugins.load_general_plugins()
    assert calls == [1]
    assert plugin_impl.is_registered()


def test_without_the_config_key_nothing_is_replaced(model_dir, restore_seams):
    config = engine_config(model_dir, additional_config={"some_other_plugin": {"x": 1}})
    v1, v2 = build_vllm_rejection_samplers(config)
    assert is_vllm_function(v1.rejection_sample)
    assert is_vllm_function(v2.rejection_sample)
    assert plugin.installed() == {}


def test_engine_config_selects_sampler_with_options(model_dir, restore_seams):
    section = {"acceptance_method": "typical_acceptance_sampler", "posterior_threshold": 0.15, "posterior_alpha": 0.2}
    config = engine_config(model_dir, {"spec_samplers": section})
    choice = choice_from_vllm_config(config)
    assert choice.name == "typical_acceptance_sampler"
    assert choice.options == {"posterior_threshold": 0.15, "posterior_alpha": 0.2}

    v1, v2 = build_vllm_rejection_samplers(config)
    for fn in (v1.rejection_sample, v2.rejection_sample):
        sampler = fn.__spec_samplers_sampler__
        assert isinstance(sampler, TypicalAcceptanceSampler)
        assert (sampler.posterior_threshold, sampler.posterior_alpha) == (0.15, 0.2)
    assert set(plugin.installed()) == {f"{V1_MODULE}.rejection_sample", f"{V2_MODULE}.rejection_sample"}

    # The next engine in this process without the key gets vLLM's functions back.
    plain = engine_config(model_dir, None)
    v1, v2 = build_vllm_rejection_samplers(plain)
    assert is_vllm_function(v1.rejection_sample) and is_vllm_function(v2.rejection_sample)


@pytest.mark.parametrize("draft_sample_method", ["greedy", "probabilistic"])
def test_block_verification_in_both_runners(model_dir, restore_seams, draft_sample_method):
    """Our block verification is a sampler like the others: selected by name, in both runners,
    whichever way vLLM drafts (vLLM's own 'block' method exists in Model Runner V2 only)."""
    overrides = {"draft_sample_method": draft_sample_method} if VLLM_033 else {}
    config = engine_config(model_dir, {"spec_samplers": {"acceptance_method": "block_verification"}}, **overrides)
    v1, v2 = build_vllm_rejection_samplers(config)
    for fn in (v1.rejection_sample, v2.rejection_sample):
        assert isinstance(fn.__spec_samplers_sampler__, BlockVerificationSampler)
    assert set(plugin.installed().values()) == {"block_verification()"}


def test_serve_cli_additional_config(model_dir, restore_seams):
    config = cli_engine_config(model_dir, '{"spec_samplers": {"acceptance_method": "rejection_sampler"}}')
    assert config.additional_config == {"spec_samplers": {"acceptance_method": "rejection_sampler"}}
    v1, v2 = build_vllm_rejection_samplers(config)
    assert type(v1.rejection_sample.__spec_samplers_sampler__).__name__ == "RejectionSampler"
    assert type(v2.rejection_sample.__spec_samplers_sampler__).__name__ == "RejectionSampler"


@pytest.mark.parametrize(
    "section, message",
    [
        (
            {"acceptance_method": "no_such_sampler"},
            "available: block_verification, multipath_block_verification, rejection_sampler, "
            "typical_acceptance_sampler",
        ),
        (
            {"acceptance_method": "typical_acceptance_sampler", "posterior_alfa": 0.3},
            "accepted options: posterior_threshold",
        ),
        ({"acceptance_method": "typical_acceptance_sampler", "posterior_alpha": -1}, "posterior_alpha"),
        ({"posterior_alpha": 0.3}, "missing 'acceptance_method'"),
        ("typical_acceptance_sampler", "expected a dict"),
    ],
)
def test_bad_section_fails_at_engine_start(model_dir, restore_seams, section, message):
    config = engine_config(model_dir, {"spec_samplers": section})
    with pytest.raises(SpecSamplersConfigError, match=message):
        choice_from_vllm_config(config)
    # What the worker does while building its model runner, before any request.
    with pytest.raises(SpecSamplersConfigError, match=message):
        build_vllm_rejection_samplers(config)
    assert plugin.installed() == {}


CONFLICTING_MODES = [
    dict(rejection_sample_method="synthetic", synthetic_acceptance_length=2.0),
    dict(rejection_sample_method="block"),
] + ([dict(rejection_sample_method="fly")] if VLLM_033 else [])


@pytest.mark.parametrize("spec_overrides", CONFLICTING_MODES, ids=lambda d: d["rejection_sample_method"])
def test_conflicting_vllm_verification_mode_fails(model_dir, restore_seams, spec_overrides):
    method = spec_overrides["rejection_sample_method"]
    config = engine_config(model_dir, {"spec_samplers": {"acceptance_method": "rejection_sampler"}}, **spec_overrides)
    with pytest.raises(SpecSamplersConfigError, match=f"rejection_sample_method='{method}'"):
        choice_from_vllm_config(config)
    if method != "fly":  # (vLLM's V1 RejectionSampler refuses FLy on CPU by itself)
        with pytest.raises(SpecSamplersConfigError, match=f"rejection_sample_method='{method}'"):
            build_vllm_rejection_samplers(config)
    assert plugin.installed() == {}
    # Without our section, vLLM's own modes are untouched.
    assert choice_from_vllm_config(engine_config(model_dir, None, **spec_overrides)) is None


def test_vllm_block_mode_points_to_our_block_sampler(model_dir):
    config = engine_config(
        model_dir, {"spec_samplers": {"acceptance_method": "block_verification"}}, rejection_sample_method="block"
    )
    with pytest.raises(SpecSamplersConfigError, match='"acceptance_method": "block_verification"'):
        choice_from_vllm_config(config)


def test_watermarking_conflicts(model_dir):
    """vLLM accepts a watermark_config only with model-based drafters (EAGLE, MTP, ...), which
    need draft weights; the config is built with n-gram drafting and given vLLM's own
    WatermarkConfig afterwards (the plugin reads only that attribute)."""
    from vllm.config import WatermarkConfig

    config = engine_config(model_dir, {"spec_samplers": {"acceptance_method": "rejection_sampler"}})
    assert choice_from_vllm_config(config) is not None
    config.watermark_config = WatermarkConfig(key=1234)
    with pytest.raises(SpecSamplersConfigError, match="watermark_config"):
        choice_from_vllm_config(config)


def test_loading_twice_is_harmless(model_dir, restore_seams, monkeypatch):
    import vllm.plugins

    for _ in range(2):
        monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
        vllm.plugins.load_general_plugins()
        plugin.register()
    assert sys.meta_path.count(plugin_impl._watcher) <= 1
    v1, v2 = seam_module(V1_MODULE), seam_module(V2_MODULE)
    for module in (v1, v2):
        init = module.RejectionSampler.__init__
        assert getattr(init, "__spec_samplers_observer__", False)
        assert not getattr(init.__wrapped__, "__spec_samplers_observer__", False)  # wrapped once, not twice

    monkeypatch.setattr(plugin_impl, "_logged", set())
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    plugin_impl.logger.addHandler(handler)
    try:
        config = engine_config(model_dir, {"spec_samplers": {"acceptance_method": "typical_acceptance_sampler"}})
        build_vllm_rejection_samplers(config)
        build_vllm_rejection_samplers(config)
    finally:
        plugin_impl.logger.removeHandler(handler)
    replaced = sorted(r.getMessage() for r in records if "replaced" in r.getMessage())
    assert replaced == [  # each replaced attribute logged once
        f"spec_samplers: replaced {V1_MODULE}.rejection_sample with typical_acceptance_sampler() (v1 runner)",
        f"spec_samplers: replaced {V2_MODULE}.rejection_sample with typical_acceptance_sampler() (v2 runner)",
    ]


def test_unsupported_version_changes_nothing(monkeypatch):
    assert plugin_impl.version_supported("0.32.0")
    assert plugin_impl.version_supported("0.32.3.dev12+gabc")
    assert plugin_impl.version_supported("0.33.0")
    assert plugin_impl.version_supported("0.33.2rc1")
    assert plugin_impl.version_supported(plugin_impl.vllm_version())  # the installed one
    assert not plugin_impl.version_supported("0.34.0")
    assert not plugin_impl.version_supported("0.31.9")
    assert not plugin_impl.version_supported("0.9.2")
    assert not plugin_impl.version_supported(None)

    monkeypatch.setattr(plugin_impl, "_registered", False)
    monkeypatch.setattr(plugin_impl, "vllm_version", lambda: "0.40.1")
    hooked = []
    monkeypatch.setattr(plugin_impl, "_when_imported", lambda *a: hooked.append(a))
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    plugin_impl.logger.addHandler(handler)
    try:
        plugin.register()
        plugin.register()
    finally:
        plugin_impl.logger.removeHandler(handler)
    assert hooked == []
    assert [r.getMessage() for r in records] == [
        "spec_samplers: vLLM 0.40.1 is not supported (supported: vllm>=0.32,<0.34); vLLM's own rejection sampler stays"
    ]


FRESH_PROCESS = """
import sys
import vllm.plugins
vllm.plugins.load_general_plugins()  # what every vLLM process does first
from spec_samplers.integrations.vllm import plugin
assert plugin.is_registered()
seams = ("vllm.v1.sample.rejection_sampler", "vllm.v1.worker.gpu.spec_decode.rejection_sampler")
assert not any(name in sys.modules for name in seams), "register() must not import vLLM's sampler modules"
import importlib
for name in seams:
    module = importlib.import_module(name)  # what the worker's model runner does later
    assert module.RejectionSampler.__init__.__spec_samplers_observer__
    assert module.rejection_sample.__module__.startswith("vllm."), "replaced without being asked"
print("fresh-process-ok")
"""


def test_fresh_process_register_then_vllm_imports_its_runners():
    """In a new process (as in a vLLM worker): the loader runs register(), which imports nothing
    of vLLM's sampler code; when the runner modules are imported later the observer is in place
    and nothing is replaced."""
    import os
    import subprocess

    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", FRESH_PROCESS], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "fresh-process-ok" in result.stdout
