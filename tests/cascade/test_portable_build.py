"""The installed llama.cpp is the portable build the Makefile makes, whatever
CPU built it or runs these tests: no ``-march=native``, no AVX-512, no AMX
(whose path crashed on AMX machines), so the wheel runs on any x86-64 CPU with
AVX2 and is safe to reuse on another machine.

Three independent witnesses: the build's recorded CMake configuration (fails
on any machine if the flags go), the machine code itself (fails wherever a
native build would emit AVX-512 or AMX instructions), and what llama.cpp
reports at run time."""

from __future__ import annotations

import importlib.metadata
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from omnilive.engines.cascade.cpu import build_features

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64", reason="the portable flags are x86-64's"
)
# Registers and instructions that only AVX-512 and AMX code uses.
WIDE_CODE = re.compile(r"%zmm\d|%k[1-7]\b|\b(tdpb\w+|tileloadd\w*|tilestored|ldtilecfg)\b")


def llama_files(suffix: str) -> list[Path]:
    dist = importlib.metadata.distribution("llama_cpp_python")
    return [Path(str(dist.locate_file(f))) for f in dist.files or [] if str(f).endswith(suffix)]


def test_the_build_configuration_is_portable() -> None:
    [config] = llama_files("cmake/ggml/ggml-config.cmake")
    settings = dict(re.findall(r'set\((GGML_\w+) "([^"]*)"\)', config.read_text()))
    assert settings["GGML_NATIVE"] == "OFF"
    assert settings["GGML_AVX2"] == "ON"
    assert settings["GGML_FMA"] == "ON"
    for wide in ("AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16", "AVX_VNNI"):
        assert settings[f"GGML_{wide}"] == "OFF", wide
    for amx in ("AMX_TILE", "AMX_INT8", "AMX_BF16"):
        assert settings[f"GGML_{amx}"] == "OFF", amx


def test_no_avx512_or_amx_instruction_in_the_cpu_backend() -> None:
    objdump = shutil.which("objdump")
    assert objdump, "objdump (binutils) comes with build-essential, which make installs"
    libraries = [p for p in llama_files(".so") if "ggml" in p.name or "llama" in p.name]
    assert any(p.name == "libggml-cpu.so" for p in libraries)
    for library in libraries:
        listing = subprocess.run(
            [objdump, "-d", "--no-show-raw-insn", str(library)],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert "vfmadd" in listing or "ggml-cpu" not in library.name  # it is real code
        wide = WIDE_CODE.search(listing)
        assert wide is None, f"{library.name} uses {wide.group(0) if wide else ''}"


def test_llama_cpp_reports_the_portable_features() -> None:
    import llama_cpp

    features = build_features(llama_cpp.llama_print_system_info().decode())
    assert {"AVX", "AVX2", "FMA", "F16C"} <= features
    assert not {f for f in features if f.startswith(("AVX512", "AMX"))}
