"""Stand-ins for libdevice calls that Triton's interpreter cannot run (it has no libdevice): same
loads and stores, approximate values. Only the interpreted byte count imports this."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def log1p(x):
    return tl.log(1.0 + x)


def install() -> None:
    from triton.language.extra import libdevice

    libdevice.log1p = log1p
