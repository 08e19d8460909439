"""What the vLLM plugin checks before it uses a seam (issue 28, "vLLM adapters that reach deep").

* Signatures: every vLLM function the plugin replaces or wraps is compared, when it is installed,
  with the signatures our code was written against (``plugin.SEAMS`` / ``plugin.WRAPS``). The
  installed vLLM's all match (no false mismatch: the plugin would silently stop being used); a
  function whose signature changed (a stand-in with one more keyword, put in vLLM's module) is
  left as vLLM's and a warning names it with both signatures, at install, not at the first step.
  The min_p / logit_bias wraps are used together: one of them left as vLLM's, and vLLM's refusal
  of min_p stands (never accepted, then dropped on the draft rows).
* Capability: the fast paths take a sampler whose class declares ``bonus_rows_in_place`` (and is
  not in strict mode), ours or a third party's, not a list of classes.
"""

from __future__ import annotations

import inspect
import logging
from types import SimpleNamespace

import pytest
import torch
import vllm_support  # noqa: F401  (sets VLLM_TARGET_DEVICE before vLLM picks a platform)
from vllm_support import (
    V1_MODULE,
    V2_MODULE,
    engine_config,
    make_model_dir,
    restore_seams,  # noqa: F401  (fixture)
    seam_module,
    v2_args,
    v2_inputs,
    v2_rejection_sampler,
)

import spec_samplers.integrations.vllm as plugin
from spec_samplers.integrations.vllm import fast_path, v1_runner, v2_runner
from spec_samplers.integrations.vllm import plugin as plugin_impl
from spec_samplers.integrations.vllm.ragged import RaggedVerifier, seam_verifier

SECTION = {"spec_samplers": {"acceptance_method": "rejection_sampler"}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("tiny-llama-seam-checks"))


@pytest.fixture
def warnings(monkeypatch):
    """The plugin's log records during the test, with its per-process memory of checks cleared."""
    monkeypatch.setattr(plugin_impl, "_logged", set())
    monkeypatch.setattr(plugin_impl, "_mismatched", {})
    monkeypatch.setattr(plugin_impl, "_features", {})
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    # a logger of its own: vLLM's logging configuration (run when it builds a config) drops the
    # handlers of the loggers under "vllm"
    capture = logging.getLogger("spec_samplers.tests.seam_checks")
    capture.propagate = False
    capture.addHandler(handler)
    monkeypatch.setattr(plugin_impl, "logger", capture)
    yield records
    capture.removeHandler(handler)


def mismatch_warnings(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if r.levelno == logging.WARNING and "signature" in r.getMessage()]


def wrap_of(qualname: str) -> plugin_impl.Wrap:
    return next(w for w in plugin_impl.WRAPS if w.qualname == qualname)


def vllm_object(wrap: plugin_impl.Wrap):
    module = seam_module(wrap.module)
    owner = module if wrap.owner is None else getattr(module, wrap.owner)
    return getattr(owner, wrap.attribute)  # ours wraps vLLM's: its signature reads vLLM's


# --- the installed vLLM: no false mismatch ----------------------------------------------------


def test_installed_vllm_signatures_all_match(restore_seams, warnings):
    for seam in plugin.SEAMS:
        module = seam_module(seam.module)
        vllm_function = plugin_impl.original(seam.qualname) or getattr(module, seam.attribute)
        assert plugin_impl.signature_text(vllm_function) in seam.signatures, seam.qualname
    for wrap in plugin_impl.WRAPS:
        assert plugin_impl.signature_text(vllm_object(wrap)) in wrap.signatures, wrap.qualname
        assert getattr(vllm_object(wrap), "__spec_samplers_wraps__", False), wrap.qualname  # installed
    assert plugin_impl.feature_installed(plugin_impl.MIN_P_LOGIT_BIAS)
    for module_name in (V1_MODULE, V2_MODULE):  # installed when asked
        assert plugin.configure_seam(seam_module(module_name), SimpleNamespace(additional_config=SECTION))
    assert set(plugin.installed()) == {seam.qualname for seam in plugin.SEAMS}
    assert plugin_impl.mismatched() == {} and mismatch_warnings(warnings) == []


def test_recorded_seam_signatures_are_our_replacements(restore_seams):
    """The newest recorded signature of each seam is our ``verify``'s after its ``verifier``
    (without our own keyword-only options), so the record and the replacement cannot drift."""
    for seam, verify in zip(plugin.SEAMS, (v1_runner.verify, v2_runner.verify)):
        params = [p for p in list(inspect.signature(verify).parameters.values())[1:] if p.kind != p.KEYWORD_ONLY]

        def as_vllm_calls_it(): ...

        as_vllm_calls_it.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        ours = plugin_impl.signature_text(as_vllm_calls_it)
        assert ours == seam.signatures[-1], seam.qualname
        # each older version's signature is a prefix of the newest (keywords with defaults added)
        for older in seam.signatures[:-1]:
            assert seam.signatures[-1].startswith(older[:-1] + ", "), seam.qualname


# --- a signature changed: vLLM's function stays, logged ----------------------------------------


def test_seam_with_a_new_keyword_is_left_to_vllm(restore_seams, warnings, monkeypatch):
    module = seam_module(V1_MODULE)
    seam = plugin.SEAMS[0]
    real = plugin_impl.original(seam.qualname)

    def rejection_sample(  # vLLM's, as a patch release might change it: one keyword more
        draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
        bonus_token_ids, sampling_metadata, synthetic_mode=False, synthetic_conditional_rates=None,
        use_fp64_gumbel=False, fly_window_size=None, fly_entropy_threshold=None, fly_entropy_top_k=3,
        new_option=None,
    ):  # fmt: skip
        return real(
            draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
            bonus_token_ids, sampling_metadata, synthetic_mode, synthetic_conditional_rates, use_fp64_gumbel,
        )  # fmt: skip

    monkeypatch.setitem(plugin_impl._originals, seam.qualname, rejection_sample)
    monkeypatch.setattr(module, "rejection_sample", rejection_sample)
    for _ in range(2):  # the engine builds its rejection sampler more than once: one warning
        assert not plugin.configure_seam(module, SimpleNamespace(additional_config=SECTION))
    assert module.rejection_sample is rejection_sample  # vLLM's, not ours
    assert seam.qualname not in plugin.installed()
    (message,) = mismatch_warnings(warnings)
    actual = plugin_impl.signature_text(rejection_sample)
    assert seam.qualname in message and actual in message and "new_option=None" in actual
    assert all(expected in message for expected in seam.signatures)
    assert plugin_impl.mismatched() == {seam.qualname: actual}
    # the wrappers of V1's plain steps find no verifier at the seam: vLLM's path throughout
    assert seam_verifier(V1_MODULE) is None


def test_v2_seam_with_a_new_keyword_is_left_to_vllm_at_engine_start(model_dir, restore_seams, warnings, monkeypatch):
    """Through the engine's own path: vLLM builds Model Runner V2's RejectionSampler under the
    engine config, the plugin's observer reads our section, finds the changed signature and
    leaves vLLM's function (no error at engine start, none at the first step)."""
    module = seam_module(V2_MODULE)
    seam = plugin.SEAMS[1]
    real = plugin_impl.original(seam.qualname)

    def rejection_sample(*args, new_option=None, **kwargs):
        return real(*args, **kwargs)

    monkeypatch.setitem(plugin_impl._originals, seam.qualname, rejection_sample)
    monkeypatch.setattr(module, "rejection_sample", rejection_sample)
    inputs = v2_inputs([dict(state=0, pos=3, drafts=[1, 2], temperature=0.0)], 16, 2)
    v2_rejection_sampler(engine_config(model_dir, SECTION), inputs)
    assert module.rejection_sample is rejection_sample and seam.qualname not in plugin.installed()
    (message,) = mismatch_warnings(warnings)
    assert seam.qualname in message and "new_option=None" in message


def test_wrap_with_a_new_keyword_is_not_wrapped(restore_seams, warnings, monkeypatch):
    module = seam_module(V1_MODULE)
    wrap = wrap_of(f"{V1_MODULE}.expand_batch_to_tokens")

    def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0, *, out=None):
        raise AssertionError("not called here")

    monkeypatch.setattr(module, "expand_batch_to_tokens", expand_batch_to_tokens)
    plugin_impl._apply_wrap(wrap, module)
    assert module.expand_batch_to_tokens is expand_batch_to_tokens
    (message,) = mismatch_warnings(warnings)
    assert wrap.qualname in message and "out=None" in message and wrap.signatures[0] in message


def test_min_p_feature_off_when_one_of_its_wraps_changed(model_dir, restore_seams, warnings, monkeypatch):
    """V1's draft rows get min_p from the wrapped ``apply_logits_processors``; if vLLM changed its
    signature, the plugin leaves it as vLLM's, builds no min_p processor and the front end keeps
    vLLM's refusal: min_p is refused, never served on the bonus rows only."""
    import vllm.v1.worker.gpu_model_runner as model_runner
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor

    rejection_sampler = seam_module(V1_MODULE).RejectionSampler

    def apply_logits_processors(self, logits, sampling_metadata, metadata, *, new_option=None):
        return logits

    monkeypatch.setattr(rejection_sampler, "apply_logits_processors", apply_logits_processors)
    assert not plugin_impl.feature_installed(plugin_impl.MIN_P_LOGIT_BIAS)
    (message,) = mismatch_warnings(warnings)
    assert "RejectionSampler.apply_logits_processors" in message and "new_option=None" in message
    with pytest.raises(VLLMValidationError, match="not yet supported with speculative decoding"):
        InputProcessor(engine_config(model_dir, SECTION))._validate_params(SamplingParams(min_p=0.1), ("generate",))
    built = model_runner.build_logitsprocs(engine_config(model_dir, SECTION), torch.device("cpu"), False, False)
    assert sorted(type(p).__name__ for p in built.all) == ["MinTokensLogitsProcessor"]  # vLLM's own choice
    # with the feature whole again, the same request is served
    monkeypatch.undo()
    monkeypatch.setattr(plugin_impl, "_features", {})
    InputProcessor(engine_config(model_dir, SECTION))._validate_params(SamplingParams(min_p=0.1), ("generate",))


# --- the capability flag ----------------------------------------------------------------------


class Delegating(torch.nn.Module):
    """A third-party sampler (not one of our classes) running rejection sampling's ragged entries."""

    def __init__(self, strict_mode: bool = False):
        super().__init__()
        from spec_samplers.rejection import RejectionSampler

        self.inner = RejectionSampler()
        self.strict_mode = strict_mode

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)

    def forward_ragged_from_logits(self, *args, **kwargs):
        return self.inner.forward_ragged_from_logits(*args, **kwargs)


class DeclaresInPlace(Delegating):
    bonus_rows_in_place = True


def test_bonus_row_capability_is_declared_not_listed():
    from spec_samplers.block import BlockVerificationSampler
    from spec_samplers.rejection import RejectionSampler
    from spec_samplers.typical import TypicalAcceptanceSampler

    assert fast_path.bonus_row_verifiable(RejectionSampler())
    assert fast_path.bonus_row_verifiable(BlockVerificationSampler())
    assert not fast_path.bonus_row_verifiable(RejectionSampler(strict_mode=True))
    assert not fast_path.bonus_row_verifiable(TypicalAcceptanceSampler())
    assert fast_path.bonus_row_verifiable(DeclaresInPlace())  # a third party that declares it
    assert not fast_path.bonus_row_verifiable(DeclaresInPlace(strict_mode=True))
    assert not fast_path.bonus_row_verifiable(Delegating())  # one that does not


@pytest.mark.parametrize("cls", [DeclaresInPlace, Delegating])
def test_third_party_sampler_takes_the_in_place_path_when_it_declares_it(monkeypatch, cls):
    """Model Runner V2's seam verifies a declaring sampler's chunk in place, bonus rows included
    (the tokens of our RejectionSampler there); one that does not declare it gets the eager path."""
    from spec_samplers.rejection import RejectionSampler

    requests = [
        dict(state=0, pos=4, drafts=[3, 1, 7], temperature=0.9, seed=11),
        dict(state=1, pos=9, drafts=[2], temperature=0.0, seed=12),
        dict(state=2, pos=1, drafts=[], temperature=1.3, seed=13),
    ]
    inputs = v2_inputs(requests, 16, 3)
    logits = torch.randn(int(inputs["cu_num_logits"][-1]), 16, generator=torch.Generator().manual_seed(5))
    expected = v2_runner.verify(RaggedVerifier(RejectionSampler()), logits, None, *v2_args(inputs), 3)
    calls = []
    in_place = v2_runner.verify_chunk_with_bonus_rows
    monkeypatch.setattr(v2_runner, "verify_chunk_with_bonus_rows", lambda *a, **k: calls.append(1) or in_place(*a, **k))
    out = v2_runner.verify(RaggedVerifier(cls()), logits, None, *v2_args(inputs), 3)
    assert len(calls) == (1 if cls is DeclaresInPlace else 0)
    assert out[0].shape == expected[0].shape
    if cls is DeclaresInPlace:
        assert torch.equal(out[0], expected[0]) and torch.equal(out[1], expected[1])
