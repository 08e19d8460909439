"""Memory a command will need, checked before it allocates (``spec-samplers bench``, ``generate``).

A run that cannot fit is refused with the option to change and the estimate, instead of growing
until the out-of-memory killer ends it (or a neighbour's job) without a message. Estimates are
upper bounds built from the tensor sizes a run allocates times a measured overhead factor
(docs/benchmarks.md, "Memory"); the available memory is the kernel's MemAvailable, lowered to the
cgroup's remaining limit when there is one. No torch import: ``generate`` checks before loading.
"""

from __future__ import annotations

import os


class MemoryBudgetError(ValueError):
    """A run whose estimated memory exceeds what the machine has available."""


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_bytes() -> int | None:
    """Host memory a new allocation can get now: /proc/meminfo's MemAvailable, or less when this
    process's address-space limit (``ulimit -v``) or its cgroup's limit (v2, else v1) is closer
    to its usage; None where none is known (then nothing is refused)."""
    found: list[int] = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:  # ulimit -v: the address space left to this process
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            with open("/proc/self/statm") as f:
                used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            found.append(max(soft - used, 0))
    except (ImportError, OSError, ValueError):
        pass
    for limit_path, usage_path in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        limit, usage = _read_int(limit_path), _read_int(usage_path)
        if limit is not None and usage is not None and limit < 1 << 60:
            found.append(max(limit - usage, 0))
            break
    return min(found) if found else None


def format_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def check_fits(estimate: int, what: str, options: str, available: int | None = None, where: str = "memory") -> None:
    """Raise :class:`MemoryBudgetError` when ``estimate`` bytes exceed ``available`` (default:
    :func:`available_bytes`). ``what`` names the allocation, ``options`` the options that size it."""
    available = available_bytes() if available is None else available
    if available is not None and estimate > available:
        raise MemoryBudgetError(
            f"{options}: {what} needs about {format_bytes(estimate)} of {where}, more than the "
            f"{format_bytes(available)} available; lower {options}"
        )
