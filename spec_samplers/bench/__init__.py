"""Acceptance microbenchmarks: ``spec-samplers bench`` and the helpers of ``benchmarks/``.

Modules:
    workloads  synthetic and loaded draft/target distribution pairs, the default grids
    quality    acceptance per position, mean emitted tokens, lossless theory, output TV
    timing     device-synchronised time per call, bytes moved and GB/s
    baselines  vLLM V0's algorithm in plain PyTorch; vLLM V1 and FlashInfer adapters
    runner     sampler selection, option parsing, sweeps, the whole run -> a result dict
    report     terminal tables, the JSON file (its schema is documented there), machine info
    plot       the PNG (matplotlib, Agg backend), one function per panel
    arguments  the command-line pieces the subcommands and ``generate`` share (types, --device,
               dtype names, SamplingParams options)
    cli        ``bench`` and its subcommands: ``verify`` (the bare ``bench``), ``sampling``,
               ``params``, ``models``
    sampling_ops  ``bench sampling``: the FlashInfer-compatible sampling operations vs PyTorch
    params_bench  ``bench params``: acceptance under SamplingParams, drafts alike vs temperature only
    models     ``bench models``: acceptance and speedup on a transformers model pair
    presets    the ``demo`` command
    suite      grid and device of the pytest-benchmark suite in ``benchmarks/``

Nothing here is imported by ``import spec_samplers``; matplotlib and tqdm are optional
(``pip install -e ".[bench]"`` in a checkout) and only needed for ``--plot`` and the progress bar.
"""
