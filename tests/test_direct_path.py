"""What a reader follows per call (issue 40): the package files and functions a public entry
executes on the host, measured by ``tools/direct_path.py levels``.

A structure check, not a timing: ``tools/direct_path.py`` runs the entries on small CPU tensors with
``backend="triton"`` under the interpreter, a warm call each, and records with ``sys.setprofile``
(nothing is patched) the package functions that run outside the kernel launches. The targets are
FILES_TARGET files per call on average over the sampler entries and FUNCTIONS_TARGET functions per
call; where the package has not reached them yet, the tests hold the level it has reached as a
ceiling (FILES_CEILING, FUNCTIONS_CEILING), so the path cannot grow back. The planted-fault test
shows that the counter sees a deeper path's extra files and functions, and does not count the
kernel's own (interpreted) code or the helpers of other packages. The corpus test shows that the
token-corpus diff sees a one-token change.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.kernels  # runs the Triton kernels (interpreted)


def _load_tool():
    spec = importlib.util.spec_from_file_location("direct_path", ROOT / "tools" / "direct_path.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["direct_path"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


dp = _load_tool()


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _level_rows(tmp_path: Path) -> list[dict]:
    """``measure_levels`` rows, in this process under the interpreter, else (a GPU run without it)
    in a fresh one under the interpreter: the structure does not depend on the device."""
    if _interpreting():
        return dp.measure_levels()
    out = tmp_path / "levels.json"
    env = dict(
        os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    cmd = [sys.executable, str(ROOT / "tools" / "direct_path.py"), "levels", "--json", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


#: the level reached (tools/direct_path.py levels, sampler entries), under the targets
#: dp.FILES_TARGET and dp.FUNCTIONS_TARGET: mean files per call (62 / 15 = 4.13) and the most
#: functions of one call (the two forward_from_logits[sampling_params], 13). A warm chain call is
#: the edge (base.py: the entry, _run, _call_key, _counter_slots; layout.py: VerifyBatch), one key
#: and one lookup of its plan (kernels/backend.py: launch_config, plan_cache, _stream_key), the
#: launcher binding its tensors (kernels/verify_launch.py: the launcher, bind_verify) and the
#: recording hook (backend.recorded): 4 files, 11-12 functions; a ``sampling_params=`` call adds
#: sampling_params.filter_tensors and the filter cut's binding (verify_launch.cuts_launch). Before
#: (b078beb): mean 6.7 files (max 9), 28.3 functions (max 39); 143a82a: 8.7 files, 47.2 functions.
FILES_CEILING = 4.2
FUNCTIONS_CEILING = 13
#: a tree entry, each call: a warm call of a checked shape is the entry, its lookup
#: (tree/entries.py: _tree_memo, base._call_key, backend.launch_config) and _run_tree_prepared (the
#: seeds, the TreeCall, base._counter_slots), then the launcher (kernels/tree_launch.py); with
#: top-k / top-p / min-p also sampling_params.filter_tensors: 4-5 files, 14-15 functions (b078beb:
#: 5-6 files, 15-16 functions, the filter forms the cold path every call; f7017bf: 7 files, 27-36)
TREE_FILES_CEILING = 5
TREE_FUNCTIONS_CEILING = 15
#: the sampling operations, each call (they are not in the sampler mean)
OTHER_FILES_CEILING = 7
OTHER_FUNCTIONS_CEILING = 34

#: one call per family, for the quick tier (the full list takes about a minute on an idle core, more under load)
QUICK = ("rejection.forward", "typical.forward_from_logits[sampling_params]", "rejection.forward_tree")
QUICK += ("sampling.top_p_sampling_from_probs", "sampling.chain_speculative_sampling")


def _ceilings(rows: list[dict]) -> list[str]:
    """The calls over their ceilings: a sampler entry's functions; a tree entry's or an
    operation's files and functions (each its own ceilings)."""
    found = []
    for r in rows:
        files, funcs = len(r["touched"]), len(r["functions"])
        if dp.sampler_rows([r]):
            limits: tuple[float, int] = (FILES_CEILING + 99, FUNCTIONS_CEILING)
        elif "tree" in r["entry"]:
            limits = (TREE_FILES_CEILING, TREE_FUNCTIONS_CEILING)
        else:
            limits = (OTHER_FILES_CEILING, OTHER_FUNCTIONS_CEILING)
        if files > limits[0] or funcs > limits[1]:
            found.append(
                f"{r['call']}: {files} files, {funcs} functions (ceilings {limits}):\n  " + "\n  ".join(r["functions"])
            )
    return found


def test_one_entry_per_family_within_its_ceiling(tmp_path):
    if _interpreting():
        rows = dp.measure_levels([c for c in dp.level_calls() if c.name in QUICK])
    else:
        rows = [r for r in _level_rows(tmp_path) if r["call"] in QUICK]
    assert sorted(r["call"] for r in rows) == sorted(QUICK)
    found = _ceilings(rows) + dp.violations(rows)
    assert not found, "\n".join(found)


@pytest.mark.not_quick
def test_files_and_functions_per_call(tmp_path):
    rows = _level_rows(tmp_path)
    entries = {r["entry"] for r in rows}
    # every listed entry was measured: the eight sampler entries, the tree entries, the operations
    assert {"forward", "forward_ragged", "forward_from_logits", "forward_ragged_from_logits"} <= entries
    assert {"forward_tree", "forward_tree_ragged", "forward_tree_from_logits"} <= entries
    assert {"forward_tree_ragged_from_logits", "top_p_sampling_from_probs", "chain_speculative_sampling"} <= entries
    sampler = dp.sampler_rows(rows)
    assert len(sampler) == 15
    m = dp.per_call(sampler)
    assert m["mean_files"] <= FILES_CEILING, dp.levels_text(sampler)
    found = _ceilings(rows) + dp.violations(rows)
    assert not found, "\n".join(found)


# -- planted fault: the counter on a tiny package with a direct path and a deeper one ---------------

_FAKE = {
    "__init__.py": "",
    "kernels.py": """
        import triton
        import triton.language as tl


        @triton.jit
        def add_one(x_ptr, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)
        """,
    "checks.py": """
        def check(x):  # a helper in a third file, on the deep path only
            return x.numel()
        """,
    "launch.py": """
        from {pkg}.checks import check
        from {pkg}.kernels import add_one


        def plan(x):  # a planning helper: it returns before the launch
            return (1,), dict(n=x.numel(), BLOCK=16)


        def launcher(x):
            grid, args = plan(x)
            add_one[grid](x, **args)
            return x


        class KernelLaunch:
            def __init__(self, grid, args, x):
                self.grid, self.args, self.x = grid, args, x

            def run(self):
                add_one[self.grid](self.x, **self.args)


        def run_all(launches):
            for launch in launches:
                launch.run()


        def deep_launcher(x):
            check(x)
            grid, args = plan(x)
            run_all([KernelLaunch(grid, args, x)])
            return x
        """,
    "entry.py": """
        import torch

        from {pkg} import launch


        class Sampler(torch.nn.Module):
            def __init__(self, deep):
                super().__init__()
                self.deep = deep

            def forward(self, x):
                return self._run(x)

            def _run(self, x):
                op = launch.deep_launcher if self.deep else launch.launcher
                return op(x)
        """,
}


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    name = "fake_direct_path_pkg"
    pkg = tmp_path / name
    pkg.mkdir()
    for file, text in _FAKE.items():
        (pkg / file).write_text(textwrap.dedent(text).format(pkg=name))
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = importlib.import_module(f"{name}.entry")
    yield pkg, entry
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


def test_counter_sees_a_deeper_path(fake_package):
    pkg, entry = fake_package
    device = "cpu" if _interpreting() else "cuda"
    rows = {}
    for deep in (False, True):
        x = torch.zeros(8, dtype=torch.int32, device=device)
        call = dp.Call(f"fake.forward[deep={deep}]", "forward", entry.Sampler(deep), (x,), {})
        (rows[deep],) = dp.measure_levels([call], package_dir=pkg)
        assert x.tolist() == [2] * 8  # the kernel ran once per call: the warm call and the measured one
    direct, deep = rows[False], rows[True]
    # nn.Module.__call__ (torch) is not counted, nor the kernel's own code (kernels.py: it runs inside
    # the launch), nor the modules' import (the warm call did it); plan() counts though it returned
    assert direct["functions"] == [
        "fake_direct_path_pkg/entry.py:Sampler._run",
        "fake_direct_path_pkg/entry.py:Sampler.forward",
        "fake_direct_path_pkg/launch.py:launcher",
        "fake_direct_path_pkg/launch.py:plan",
    ]
    assert direct["touched"] == ["fake_direct_path_pkg/entry.py", "fake_direct_path_pkg/launch.py"]
    assert direct["path"] == ["Sampler.forward", "Sampler._run", "launcher"] and direct["launches"] == ["add_one"]
    assert dp.violations([direct]) == []
    assert deep["touched"] == sorted(direct["touched"] + ["fake_direct_path_pkg/checks.py"])
    extra = sorted(set(deep["functions"]) - set(direct["functions"]))
    assert extra == [
        "fake_direct_path_pkg/checks.py:check",
        "fake_direct_path_pkg/launch.py:KernelLaunch.__init__",
        "fake_direct_path_pkg/launch.py:KernelLaunch.run",
        "fake_direct_path_pkg/launch.py:deep_launcher",
        "fake_direct_path_pkg/launch.py:run_all",
    ]
    assert len(deep["functions"]) == 8 and dp.per_call([direct, deep])["max_functions"] == 8
    assert deep["levels"] == 5
    (message,) = dp.violations([deep])
    assert "5 levels > 3" in message and "run_all" in message and "KernelLaunch.run" in message
    # and a call that launches nothing is reported, not passed
    assert dp.violations([dict(direct, launches=[], path=[], levels=0)]) == [
        f"{direct['call']}: no kernel launch recorded"
    ]


# -- the corpus diff --------------------------------------------------------------------------------


def test_corpus_diff_sees_one_token(tmp_path):
    calls = dp._sampling_calls("torch", 3)[:2] + dp._sampler_calls("torch", 1)[:1]
    before = {f"torch:{c.name}": dp._tokens(c.fn(*c.args, **c.kwargs)) for c in calls}
    again = {f"torch:{c.name}": dp._tokens(c.fn(*c.args, **c.kwargs)) for c in calls}
    assert dp.diff(before, again) == []  # seeded: the same tokens twice
    after = copy.deepcopy(before)
    key = "torch:rejection.forward"
    after[key][1][0] += 1
    (line,) = dp.diff(before, after)
    assert line.startswith(f"~ {key}:")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(before))
    b.write_text(json.dumps(after))
    assert dp.main(["diff", str(a), str(a)]) == 0
    assert dp.main(["diff", str(a), str(b)]) == 1
