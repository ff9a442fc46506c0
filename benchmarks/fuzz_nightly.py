"""The fuzz tests of ``make test``, many times bigger: a nightly-style run.

Runs ``tests/security/test_fuzz_decoders.py`` (every client decoder, gateway
and worker side) and ``tests/security/test_fuzz_live.py`` (a real gateway and
worker) with ``FUZZ_SCALE`` times their example counts and a fresh random
seed, then saves what ran under benchmarks/results/fuzz_nightly.json. A
failure prints hypothesis' shrunk example and its seed (pass ``--seed`` to
replay it).

    python -m benchmarks.fuzz_nightly [--scale 20] [--seed N] [--decoders-only]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
REPO = Path(__file__).resolve().parents[1]
DECODERS = "tests/security/test_fuzz_decoders.py"
LIVE = "tests/security/test_fuzz_live.py"
# Frames per unit of scale in each file (see their docstrings).
FRAMES_PER_SCALE = {DECODERS: 11_000, LIVE: 800}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=20.0, help="multiplies example counts")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (random)")
    parser.add_argument("--decoders-only", action="store_true", help="skip the live server")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else secrets.randbelow(2**32)
    files = [DECODERS] if args.decoders_only else [DECODERS, LIVE]
    started = time.perf_counter()
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        f"--hypothesis-seed={seed}", *files,
    ]  # fmt: skip
    env = {**os.environ, "FUZZ_SCALE": str(args.scale)}
    print(f"fuzzing at scale {args.scale:g} with seed {seed}: {' '.join(files)}", flush=True)
    done = subprocess.run(command, cwd=REPO, env=env, check=False)
    elapsed = time.perf_counter() - started
    frames = int(sum(FRAMES_PER_SCALE[f] * args.scale for f in files))
    result = {
        "passed": done.returncode == 0,
        "seed": seed,
        "scale": args.scale,
        "files": files,
        "approx_frames": frames,
        "elapsed_s": round(elapsed, 1),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, {platform.python_version()}",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fuzz_nightly.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
