"""Which llama.cpp builds the cascade engine loads, and how, on which CPUs."""

from __future__ import annotations

import pytest

from omnilive.engines.base import EngineUnavailable
from omnilive.engines.cascade.cpu import build_features, cpu_flags, plan_for

PORTABLE = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
    "LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
)
NATIVE_SAPPHIRE_RAPIDS = (
    PORTABLE + "AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | "
)
AVX2_CPU = frozenset(["fpu", "sse", "sse2", "pni", "ssse3", "fma", "f16c", "avx", "avx2", "bmi2"])
AMX_CPU = AVX2_CPU | {"avx512f", "avx512_vbmi", "avx512_vnni", "avx512_bf16", "amx_tile",
                      "amx_int8", "amx_bf16"}  # fmt: skip


def test_build_features_are_what_system_info_reports_on() -> None:
    assert build_features(PORTABLE) == {
        "SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "BMI2", "LLAMAFILE", "OPENMP", "REPACK",
    }  # fmt: skip
    assert "AVX512" not in build_features("CPU : AVX2 = 1 | AVX512 = 0 |")


def test_cpu_flags_from_proc_cpuinfo() -> None:
    text = "processor\t: 0\nflags\t\t: fpu avx2 amx_int8\nbugs\t\t: spectre\n"
    assert cpu_flags(text) == {"fpu", "avx2", "amx_int8"}
    assert cpu_flags("") == frozenset()


@pytest.mark.parametrize("cpu", [AVX2_CPU, AMX_CPU])
def test_the_portable_build_runs_everywhere_with_every_buffer_type(cpu: frozenset[str]) -> None:
    plan = plan_for("x86_64", build_features(PORTABLE), cpu)
    assert plan.extra_buffer_types
    assert plan.note is None


def test_an_amx_build_loads_without_extra_buffer_types() -> None:
    """The crash seen on AMX machines came through llama.cpp's AMX buffer type."""
    plan = plan_for("x86_64", build_features(NATIVE_SAPPHIRE_RAPIDS), AMX_CPU)
    assert not plan.extra_buffer_types
    assert plan.note is not None and "AMX_INT8" in plan.note


def test_a_build_for_another_cpu_is_refused_in_one_line() -> None:
    with pytest.raises(EngineUnavailable) as refused:
        plan_for("x86_64", build_features(NATIVE_SAPPHIRE_RAPIDS), AVX2_CPU)
    message = str(refused.value)
    assert "AMX_INT8, AVX512, AVX512_BF16, AVX512_VBMI, AVX512_VNNI" in message
    assert "\n" not in message


def test_a_cpu_without_avx2_is_refused() -> None:
    with pytest.raises(EngineUnavailable, match="AVX2"):
        plan_for("x86_64", build_features(PORTABLE), frozenset({"sse2", "avx"}))


def test_other_architectures_are_not_second_guessed() -> None:
    assert plan_for("aarch64", frozenset({"NEON"}), frozenset({"asimd"})).extra_buffer_types
