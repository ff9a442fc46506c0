"""How fast the installed llama.cpp build runs the cascade's language model.

The Makefile builds llama-cpp-python portably (x86-64-v3: AVX2, FMA, F16C,
BMI2; no AVX-512, no AMX) instead of llama.cpp's default ``-march=native``.
This measures what that costs on the machine at hand: run it in the project's
``.venv`` and in an environment holding another build of the same version,
and compare. It loads SmolLM2-135M (Q4_1) the way the engine does and times
prompt evaluation and generation, each repeated; the figures, the build's
features and the CPU's flags are printed and saved under benchmarks/results/.

    python -m benchmarks.llm_build [--label portable] [--threads 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from omnilive.engines.cascade.cpu import build_features, cpu_flags
from omnilive.engines.cascade.llm import LlamaChat, Message
from omnilive.engines.cascade.models import llm_gguf_path

RESULTS = Path(__file__).parent / "results"
PROMPT = [
    Message("system", "You are a helpful assistant who answers in one short paragraph."),
    Message("user", "Tell me about the history of the city of Paris, from the Romans to today."),
]
WIDE_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_int8", "amx_bf16")


def measure(threads: int, repeats: int, new_tokens: int) -> dict[str, Any]:
    import llama_cpp

    chat = LlamaChat(llm_gguf_path(), threads)
    chat.load()
    llm = chat._llm  # the raw model, to time evaluation and sampling apart
    prompt = chat.tokens(PROMPT)
    prompt_tps: list[float] = []
    generate_tps: list[float] = []
    for _ in range(repeats):
        llm.reset()
        started = time.perf_counter()
        llm.eval(prompt)
        prompt_tps.append(len(prompt) / (time.perf_counter() - started))
        started = time.perf_counter()
        for _ in range(new_tokens):
            token = llm.sample(temp=0.0)
            llm.eval([token])
        generate_tps.append(new_tokens / (time.perf_counter() - started))
    chat.close()
    return {
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "build_features": sorted(build_features(llama_cpp.llama_print_system_info().decode())),
        "prompt_tokens": len(prompt),
        "prompt_tokens_per_s": round(statistics.median(prompt_tps), 1),
        "generated_tokens": new_tokens,
        "generate_tokens_per_s": round(statistics.median(generate_tps), 1),
        "runs": repeats,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="installed", help="name of this build in the results")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    flags = cpu_flags(Path("/proc/cpuinfo").read_text())
    result = {
        "label": args.label,
        "machine": platform.machine(),
        "cpu_flags": [f for f in WIDE_FLAGS if f in flags],
        "threads": args.threads,
        **measure(args.threads, args.repeats, args.new_tokens),
    }
    print(json.dumps(result, indent=2))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"llm_build_{args.label}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
