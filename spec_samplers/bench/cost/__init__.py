"""A cost model of one verification call without a GPU (``spec-samplers profile``).

Four measurements of the code that would run, each in its own module:

* :mod:`.trace`: every Triton launch a call makes (caught where Triton launches, so any kernel
  on the launch path is seen, ours or a peer's) and every eager PyTorch op outside kernels (a
  dispatch mode), at full shape on meta tensors;
* :mod:`.counting`: the bytes each launch loads and stores, counted by the Triton interpreter at
  small shapes and scaled to the full shape;
* :mod:`.sass`: each launched variant compiled for sm_90 and its SASS read (registers, spills,
  shared memory, the vocabulary loops' instructions by class);
* :mod:`.model`: the modeled time on H100 / H200 from those counts and stated constants.

:mod:`.workloads` builds the calls (our samplers, the vLLM seams, vLLM's own verification);
:mod:`.worker` runs the stages that need a particular Triton mode in a subprocess;
:mod:`.report` joins them into rows, a table and JSON. Every time here is **modeled**.
"""
