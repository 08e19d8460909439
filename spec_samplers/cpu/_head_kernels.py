"""numba kernel of a small CPU head product: logits [R, V] = rows [R, H] @ weight[V, H].T for a
few fp32 rows (``integrations.transformers.HEAD_KERNEL_ROWS``), the product
``integrations.transformers.head_logits`` takes for a decoding step's positions.

MKL reads the head once per row for such shapes (F.linear), and its matrix product of the
transposed form (``weight @ rows.T``, which streams the head once) still reads it at about half the
machine's bandwidth: at [32000, 512], one thread, 2.6 ms against the ~1.6 ms a 65 MB read takes.
Here each head row is read once and dotted with every row in one loop (R accumulators, vectorised
over H; blocks of 8, then 4, 2 and 1 rows): 1.2 ms at R = 1, 1.7 at R = 2, 2.0 at R = 4, 2.6 at
R = 8. The dot products are summed in another
order than MKL's (``fastmath`` reassociation and contraction on them alone): the logits equal
F.linear's to a few fp32 ulps, as the streamed product's do.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_F0 = np.float32(0.0)


@njit(cache=True, fastmath={"reassoc", "contract"})
def _one(w, x0, out0):
    for v in range(w.shape[0]):
        wr = w[v]
        a0 = _F0
        for h in range(w.shape[1]):
            a0 += wr[h] * x0[h]
        out0[v] = a0


@njit(cache=True, fastmath={"reassoc", "contract"})
def _two(w, x0, x1, out0, out1):
    for v in range(w.shape[0]):
        wr = w[v]
        a0 = _F0
        a1 = _F0
        for h in range(w.shape[1]):
            wh = wr[h]
            a0 += wh * x0[h]
            a1 += wh * x1[h]
        out0[v] = a0
        out1[v] = a1


@njit(cache=True, fastmath={"reassoc", "contract"})
def _four(w, x0, x1, x2, x3, out0, out1, out2, out3):
    for v in range(w.shape[0]):
        wr = w[v]
        a0 = _F0
        a1 = _F0
        a2 = _F0
        a3 = _F0
        for h in range(w.shape[1]):
            wh = wr[h]
            a0 += wh * x0[h]
            a1 += wh * x1[h]
            a2 += wh * x2[h]
            a3 += wh * x3[h]
        out0[v] = a0
        out1[v] = a1
        out2[v] = a2
        out3[v] = a3


@njit(cache=True, fastmath={"reassoc", "contract"})
def _eight(w, x, out):
    x0, x1, x2, x3, x4, x5, x6, x7 = x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]
    for v in range(w.shape[0]):
        wr = w[v]
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = _F0
        for h in range(w.shape[1]):
            wh = wr[h]
            a0 += wh * x0[h]
            a1 += wh * x1[h]
            a2 += wh * x2[h]
            a3 += wh * x3[h]
            a4 += wh * x4[h]
            a5 += wh * x5[h]
            a6 += wh * x6[h]
            a7 += wh * x7[h]
        out[0, v] = a0
        out[1, v] = a1
        out[2, v] = a2
        out[3, v] = a3
        out[4, v] = a4
        out[5, v] = a5
        out[6, v] = a6
        out[7, v] = a7


@njit(cache=True)
def head_rows_kernel(
    weight,  # [V, H] fp32, C-contiguous
    rows,  # [R, H] fp32, R >= 1
    out,  # [R, V] fp32
):
    """out[r] = weight @ rows[r] for every r: the head read once per block of 8 rows, then once
    for the 4, 2 and 1 rows left."""
    R = rows.shape[0]
    r = 0
    while R - r >= 8:
        _eight(weight, rows[r : r + 8], out[r : r + 8])
        r += 8
    if R - r >= 4:
        _four(weight, rows[r], rows[r + 1], rows[r + 2], rows[r + 3], out[r], out[r + 1], out[r + 2], out[r + 3])
        r += 4
    if R - r >= 2:
        _two(weight, rows[r], rows[r + 1], out[r], out[r + 1])
        r += 2
    if R - r == 1:
        _one(weight, rows[r], out[r])
