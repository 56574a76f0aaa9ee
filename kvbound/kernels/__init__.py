"""Triton kernels with plain-PyTorch reference twins (filled by the executor work)."""
