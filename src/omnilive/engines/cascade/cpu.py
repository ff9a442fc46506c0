"""Whether the installed llama.cpp can run on this CPU, and on which path.

The Makefile builds llama-cpp-python for a fixed instruction set, x86-64-v3
(AVX2, FMA, F16C, BMI2; no AVX-512, no AMX), so that one wheel runs on every
x86-64 CPU with AVX2. A build from elsewhere (a plain ``pip install`` compiles
llama.cpp with ``-march=native``) carries the extensions of the machine that
built it. Two things can then go wrong, and both are caught here before the
model loads:

- the build uses an extension this CPU lacks (a wheel reused from another
  machine through pip's cache): it would die with SIGILL, so the engine
  refuses to load and says how to rebuild;
- the build has llama.cpp's AMX path, which crashed (SIGSEGV in the first
  decode) on an AMX machine: the model is loaded with llama.cpp's extra buffer
  types off, which keeps AMX out of the computation.

``llama_print_system_info()`` names what the build was compiled with, e.g.
``CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | ...``.
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass
from pathlib import Path

from omnilive.engines.base import EngineUnavailable

# A build feature (as llama.cpp names it) and the /proc/cpuinfo flag it needs.
X86_FEATURE_FLAGS = {
    "SSE3": "pni",
    "SSSE3": "ssse3",
    "AVX": "avx",
    "AVX2": "avx2",
    "F16C": "f16c",
    "FMA": "fma",
    "BMI2": "bmi2",
    "AVX_VNNI": "avx_vnni",
    "AVX512": "avx512f",
    "AVX512_VBMI": "avx512_vbmi",
    "AVX512_VNNI": "avx512_vnni",
    "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8",
    "AMX_BF16": "amx_bf16",
}
AMX_FEATURES = frozenset({"AMX_INT8", "AMX_BF16"})
REBUILD_HINT = "reinstall it portably: rm -rf .venv && make serve (docs/operating/cpu.md)"
_FEATURE = re.compile(r"([A-Z0-9_]+) = 1")


def build_features(system_info: str) -> frozenset[str]:
    """The features ``llama_print_system_info()`` reports as compiled in."""
    return frozenset(_FEATURE.findall(system_info))


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The flags of the first processor in a ``/proc/cpuinfo`` text."""
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


@dataclass(frozen=True)
class BuildPlan:
    """How to load the model with this build on this CPU."""

    extra_buffer_types: bool  # llama.cpp's AMX and repacked-weight buffers
    note: str | None = None  # a warning for the log, if any


def plan_for(machine: str, features: frozenset[str], flags: frozenset[str]) -> BuildPlan:
    """The plan for a build with ``features`` on a CPU with ``flags``, or an
    :class:`EngineUnavailable` saying why this pair cannot run."""
    if machine not in ("x86_64", "AMD64") or not flags:
        return BuildPlan(extra_buffer_types=True)  # nothing known to check
    if "avx2" not in flags:
        raise EngineUnavailable(
            "the cascade engine's llama.cpp needs a CPU with AVX2, and this one has none"
        )
    missing = sorted(
        f for f in features if f in X86_FEATURE_FLAGS and X86_FEATURE_FLAGS[f] not in flags
    )
    if missing:
        raise EngineUnavailable(
            f"the installed llama-cpp-python was built for another CPU: it uses "
            f"{', '.join(missing)}, which this CPU lacks; {REBUILD_HINT}"
        )
    amx = sorted(features & AMX_FEATURES)
    if amx:
        return BuildPlan(
            extra_buffer_types=False,
            note=(
                f"the installed llama-cpp-python was built with {', '.join(amx)} "
                f"(-march=native), whose path crashed on AMX machines: loading the model "
                f"with llama.cpp's extra buffer types off; {REBUILD_HINT}"
            ),
        )
    return BuildPlan(extra_buffer_types=True)


def plan_for_this_machine(system_info: str) -> BuildPlan:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    return plan_for(platform.machine(), build_features(system_info), cpu_flags(cpuinfo))
