"""``python -m spec_samplers.cpu``: compile the CPU path's kernels into numba's on-disk cache now
(an install step, or a container build), so that no process pays the compilation on its first
sampler call (tens of seconds on a loaded machine; loading the cache afterwards takes well under
one). Prints the seconds each group of calls took, and marks this machine's cache (``cpu.kernels``)."""

from __future__ import annotations

from spec_samplers import cpu
from spec_samplers.cpu import _warm


def main() -> None:
    if cpu._import_kernels() is None:
        raise SystemExit("numba is not installed: pip install 'spec-samplers[cpu]'")
    for name, seconds in _warm.compile_ahead().items():
        print(f"{name}: {seconds:.2f} s")


if __name__ == "__main__":
    main()
