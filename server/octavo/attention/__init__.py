"""Paged attention: metadata, the torch path (CPU) and Triton kernels (GPU)."""
