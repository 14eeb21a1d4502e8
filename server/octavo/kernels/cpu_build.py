"""Building and loading Octavo's C++ CPU kernels (``torch.ops.octavo_cpu``).

The sources in ``csrc/`` are compiled once per CPU family (AVX-512, AVX2, or plain x86-64/
other) with ``torch.utils.cpp_extension`` into ``$OCTAVO_KERNELS_DIR`` (default
``$OCTAVO_CACHE/kernels``); the folder name carries a hash of the sources, the flags and
torch's version, so an existing library is loaded as is (the image builds them in advance
and may be read-only). Without a compiler, or with ``OCTAVO_NATIVE_KERNELS=0``, the engine
runs the torch path instead and logs why.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from octavo.cache_dirs import cache_root
from octavo.kernels.cpu_features import cpu_flags
from octavo.progress import PhaseReporter

logger = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).parent / "csrc"
SOURCES = (
    "ops.cpp",
    "norm.cpp",
    "activation.cpp",
    "gelu.cpp",
    "rotary.cpp",
    "kv_store.cpp",
    "decode_attention.cpp",
    "prefill_attention.cpp",
    "shm_all_reduce.cpp",
    "token_bitmask.cpp",
    "quantized_linear.cpp",
    "lora_delta.cpp",
    "sampling.cpp",
    "logprobs.cpp",
    "dense_linear.cpp",
    "dense_linear_bf16.cpp",
)
DISABLE_ENV = "OCTAVO_NATIVE_KERNELS"
KERNELS_DIR_ENV = "OCTAVO_KERNELS_DIR"
ISA_ENV = "OCTAVO_CPU_ISA"  # force a narrower build (avx2, generic), e.g. to test it
COMMON_FLAGS = (
    "-O3",
    "-std=c++20",
    "-fopenmp",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-ffp-contract=off",
)
ISA_FLAGS = {
    "avx512": (
        "-mavx512f",
        "-mavx512bw",
        "-mavx512vl",
        "-mavx512dq",
        "-mavx2",
        "-mfma",
        "-mf16c",
        "-mprefer-vector-width=512",
    ),
    "avx2": ("-mavx2", "-mfma", "-mf16c"),
    "generic": (),
}


@dataclass(frozen=True)
class KernelBuild:
    isa: str
    name: str
    folder: Path

    @property
    def library(self) -> Path:
        return self.folder / f"{self.name}.so"


def cpu_isa() -> str:
    """The widest instruction set the kernels are built for on this CPU (or ``$OCTAVO_CPU_ISA``)."""
    forced = os.environ.get(ISA_ENV)
    if forced:
        if forced not in ISA_FLAGS:
            raise ValueError(f"{ISA_ENV}={forced!r}: expected one of {sorted(ISA_FLAGS)}")
        return forced
    flags = cpu_flags()
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "avx512"
    if {"avx2", "fma", "f16c"} <= flags:
        return "avx2"
    return "generic"


def kernels_dir() -> Path:
    configured = os.environ.get(KERNELS_DIR_ENV)
    if configured:
        return Path(configured)
    return cache_root() / "kernels"


def plan_build(isa: str) -> KernelBuild:
    digest = hashlib.sha256(torch.__version__.encode())
    for flag in (*COMMON_FLAGS, *ISA_FLAGS[isa]):
        digest.update(flag.encode())
    for source in sorted(SOURCE_DIR.iterdir()):
        digest.update(source.name.encode() + source.read_bytes())
    name = f"octavo_cpu_ops_{isa}_{digest.hexdigest()[:12]}"
    return KernelBuild(isa, name, kernels_dir() / name)


def build(plan: KernelBuild) -> Path:
    """Compile the kernels for ``plan`` unless its library already exists; returns its path."""
    if plan.library.exists():
        return plan.library
    from torch.utils import cpp_extension

    _put_ninja_on_path()
    plan.folder.mkdir(parents=True, exist_ok=True)
    with _build_lock(plan.folder):
        if plan.library.exists():  # another process built it while this one waited
            return plan.library
        # torch's own lock file, left behind by a build that was killed, would make every
        # later build wait forever; holding the flock proves no build is running.
        (plan.folder / "lock").unlink(missing_ok=True)
        with PhaseReporter(f"compiling CPU kernels ({plan.isa})", 1, "builds") as progress:
            _compile(plan, cpp_extension)
            progress.update()
    return plan.library


@contextlib.contextmanager
def _build_lock(folder: Path):
    """One build per folder at a time, across processes; the kernel drops the lock of a
    process that dies, so a killed build never blocks the next one."""
    with open(folder / ".octavo-build.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _compile(plan: KernelBuild, cpp_extension) -> None:
    logger.info("compiling Octavo's CPU kernels (%s) into %s, once", plan.isa, plan.folder)
    flags = [*COMMON_FLAGS, *ISA_FLAGS[plan.isa]]
    cpp_extension.load(
        name=plan.name,
        sources=[str(SOURCE_DIR / source) for source in SOURCES],
        extra_cflags=flags,
        extra_ldflags=["-fopenmp"],
        build_directory=str(plan.folder),
        is_python_module=False,
        verbose=False,
    )


def _put_ninja_on_path() -> None:
    """torch runs ``ninja`` from PATH; the ``ninja`` wheel's binary is not there unless the
    venv is activated."""
    try:
        import ninja
    except ImportError:
        return
    os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])


class _Loader:
    """Loads the library once per process; remembers why it could not."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loaded: bool | None = None
        self.reason = ""

    def ops(self):
        if self.loaded is None:
            with self.lock:
                if self.loaded is None:
                    self.loaded = self._load()
        return torch.ops.octavo_cpu if self.loaded else None

    def _load(self) -> bool:
        if os.environ.get(DISABLE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
            self.reason = f"{DISABLE_ENV}=0"
            return False
        try:
            library = build(plan_build(cpu_isa()))
            torch.ops.load_library(str(library))
        except Exception as error:  # no compiler, no headers, a failed build: run the torch path
            self.reason = f"{type(error).__name__}: {error}"
            logger.warning("native CPU kernels unavailable, using the torch path (%s)", self.reason)
            return False
        return True


_LOADER = _Loader()


def cpu_ops():
    """``torch.ops.octavo_cpu`` when the native kernels load on this machine, else None."""
    return _LOADER.ops()


NATIVE_DTYPES = (torch.float32, torch.bfloat16)


def native_ops(device: torch.device, dtype: torch.dtype):
    """The native ops when they handle ``dtype`` on ``device`` (float32/bfloat16 on CPU)."""
    if device.type != "cpu" or dtype not in NATIVE_DTYPES:
        return None
    return _LOADER.ops()


def native_op_owner(device: torch.device, op: str):
    """The native ops when they run float32 on ``device`` and have ``op`` (a build from
    older sources may not), else None."""
    ops = native_ops(device, torch.float32)
    return ops if ops is not None and hasattr(ops, op) else None


def ops_for(tensor: torch.Tensor):
    """``native_ops`` for this tensor's device and dtype."""
    return native_ops(tensor.device, tensor.dtype)


def unavailable_reason() -> str:
    """Why ``cpu_ops()`` returned None ('' when it did not)."""
    return _LOADER.reason


def use_torch_path(enabled: bool = True) -> None:
    """Force the torch path in this process (``enabled=False`` loads the kernels again)."""
    with _LOADER.lock:
        _LOADER.loaded = False if enabled else None
        _LOADER.reason = "torch path chosen in this process" if enabled else ""
