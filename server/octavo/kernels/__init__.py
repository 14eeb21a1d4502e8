"""Native kernels: C++ for the CPU path (``cpu_build``); Triton for CUDA lives in ``attention``."""
