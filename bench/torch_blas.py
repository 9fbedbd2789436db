"""Gives PyTorch's CPU step its fast kernels and an allocator that reuses memory, so that
peertrain is measured against the best this machine's PyTorch does, not a handicapped one.

Import this before torch.

Kernels. Debian's OpenBLAS 0.3.21 picks its kernels from the CPU's model number. On a model
it does not know (Emerald Rapids, model 207) it falls back to "Prescott", plain SSE3; on AMD
Zen 5 it picks "Haswell", AVX2, though the core has AVX-512, and runs at about half the
AVX-512 kernels' rate (measured in docs/performance.md). So when OPENBLAS_CORETYPE is not
already set and OpenBLAS's own choice has no AVX-512 kernels on an AVX-512 machine, or the
environment names a core without them, this sets OPENBLAS_CORETYPE to the newest AVX-512
kernels this OpenBLAS has (Cooperlake where the CPU has AVX512-BF16, else SkylakeX).
OpenBLAS reads the variable when torch loads it, hence "before torch".

Allocator. glibc's malloc serves blocks over its mmap threshold (128 KiB to 32 MiB, moving)
with fresh pages and returns them on free, so each step's activation and gradient tensors
fault their pages in again; on a VM where a page fault is dear that makes torch's steps
up to four times slower (docs/performance.md). PyTorch's own tuning guide advises a caching
allocator (jemalloc, tcmalloc) on the CPU; this sets glibc's thresholds with mallopt so
freed memory is kept and reused, which is what those do for a training loop.

`core()` says which kernels torch's OpenBLAS runs and that the allocator keeps memory, for
the report.
"""
import ctypes
import os
import re
import subprocess
import sys

AVX512_CORES = {"skylakex", "cooperlake", "sapphirerapids"}  # OpenBLAS's cores with AVX-512 kernels


def _detected_core():
    """The core OpenBLAS picks by itself, asked in a child process (a library loaded here
    would keep its choice for the rest of this process)."""
    env = dict(os.environ, OPENBLAS_VERBOSE="2")
    env.pop("OPENBLAS_CORETYPE", None)
    probe = "import ctypes\ntry:\n    ctypes.CDLL('libopenblas.so.0')\nexcept OSError:\n    pass\n"
    try:
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"Core: (\S+)", out.stdout + out.stderr)
    return match.group(1) if match else None


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


_detected = None  # the core OpenBLAS picks by itself, asked when the environment names none
_replaced = None  # an OPENBLAS_CORETYPE from the environment that this module replaced
_flags = _cpu_flags()
if "avx512f" in _flags:
    _best = "COOPERLAKE" if "avx512_bf16" in _flags else "SKYLAKEX"
    _given = os.environ.get("OPENBLAS_CORETYPE")
    if _given is None:
        _detected = _detected_core()
        if _detected and _detected.lower() not in AVX512_CORES:
            os.environ["OPENBLAS_CORETYPE"] = _best
    elif _given.lower() not in AVX512_CORES:
        # Set by the machine's environment (some Zen 5 VMs export Haswell): the peer would
        # run at half its speed, so it gets its AVX-512 kernels here too, and the report says so.
        _replaced = _given
        os.environ["OPENBLAS_CORETYPE"] = _best


def _keep_freed_memory():
    """mallopt(M_MMAP_THRESHOLD, 1 GiB), (M_TRIM_THRESHOLD, 1 GiB), (M_TOP_PAD, 64 MiB):
    blocks come from the heap and stay there when freed. False where there is no glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
        ok = libc.mallopt(m_mmap_threshold, 1 << 30) == 1
        ok = libc.mallopt(m_trim_threshold, 1 << 30) == 1 and ok
        return libc.mallopt(m_top_pad, 64 << 20) == 1 and ok
    except (OSError, AttributeError):
        return False


_keeps_memory = _keep_freed_memory()


def _loaded_openblas_core():
    """The core that the OpenBLAS loaded in this process runs, from openblas_get_corename();
    None when no OpenBLAS is loaded here (torch on MKL, say) or it cannot be asked."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)  # already mapped: the same instance torch uses
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return lib.openblas_get_corename().decode()
        except (OSError, AttributeError):
            continue
    return None


def core():
    """The BLAS kernels torch runs with, asked of the OpenBLAS in this process (call it after
    importing torch), e.g. "OpenBLAS Cooperlake (forced: OpenBLAS picked Prescott)"; "not OpenBLAS"
    when torch did not load one."""
    running = _loaded_openblas_core()
    memory = ", malloc keeps freed memory" if _keeps_memory else ""
    if running is None:
        return "not OpenBLAS" + memory
    forced = os.environ.get("OPENBLAS_CORETYPE")
    if forced and _replaced:
        return f"OpenBLAS {running} (forced over OPENBLAS_CORETYPE={_replaced}){memory}"
    if forced and _detected:
        return f"OpenBLAS {running} (forced: OpenBLAS picked {_detected}){memory}"
    if forced:
        return f"OpenBLAS {running} (OPENBLAS_CORETYPE={forced}){memory}"
    return f"OpenBLAS {running}{memory}"
