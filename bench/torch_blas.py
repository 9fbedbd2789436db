"""Gives PyTorch's OpenBLAS its fast kernels on a CPU too new for it to recognise.

Import this before torch. Debian's OpenBLAS 0.3.21 picks its kernels from the CPU's model
number; on a model it does not know (Emerald Rapids, model 207, for one) it falls back to
"Prescott", plain SSE3, and torch's CPU step runs about 3x slower than the same machine
allows. Measuring peertrain against that would flatter it. So when OPENBLAS_CORETYPE is
not already set and OpenBLAS's own choice is a generic core on an AVX-512 machine, this
sets OPENBLAS_CORETYPE to the newest AVX-512 kernels this OpenBLAS has (Cooperlake where the
CPU has AVX512-BF16, else SkylakeX). OpenBLAS reads the variable when torch loads it, hence
"before torch". `core()` says which kernels torch's OpenBLAS runs, for the report.
"""
import ctypes
import os
import re
import subprocess
import sys

GENERIC_CORES = {"prescott", "core2", "nehalem", "penryn", "dunnington", "atom", "unknown"}


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


_detected = None
if "OPENBLAS_CORETYPE" not in os.environ:
    _detected = _detected_core()
    flags = _cpu_flags()
    if _detected and _detected.lower() in GENERIC_CORES and "avx512f" in flags:
        os.environ["OPENBLAS_CORETYPE"] = "COOPERLAKE" if "avx512_bf16" in flags else "SKYLAKEX"


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
    if running is None:
        return "not OpenBLAS"
    forced = os.environ.get("OPENBLAS_CORETYPE")
    if forced and _detected:
        return f"OpenBLAS {running} (forced: OpenBLAS picked {_detected})"
    if forced:
        return f"OpenBLAS {running} (OPENBLAS_CORETYPE={forced})"
    return f"OpenBLAS {running}"
