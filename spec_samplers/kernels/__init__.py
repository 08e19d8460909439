"""Triton kernels and their launchers (no engine imports)."""
