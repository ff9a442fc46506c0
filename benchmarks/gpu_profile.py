"""What holds the worker's interpreter: py-spy samples of a running engine, summarised.

``gpu_density.py --profile-at N`` starts :class:`Sampler` on the worker while
N sessions run: two py-spy recordings side by side, one of the thread that
holds the interpreter lock (``--gil``: the host's limit when one core is the
ceiling) and one of every thread that is running (not idle: the lock holder,
threads in C without the lock, spin-waits on the GPU). Both are written as
py-spy's collapsed stacks; :func:`summarize` turns one into the top functions
by samples where they are the innermost Python frame (self) and where they are
anywhere on the stack (inclusive), and the samples per thread.

``python -m benchmarks.gpu_profile RAW [RAW ...] --out JSON`` summarises saved
recordings. Measures; asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

FRAME = re.compile(r"^(?P<name>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


class Sampler:
    """py-spy recordings of some processes for a while, lock holder and active threads."""

    def __init__(self, py_spy: str, out_dir: Path, rate: int = 100) -> None:
        self.py_spy, self.out_dir, self.rate = py_spy, out_dir, rate
        self._running: list[subprocess.Popen[bytes]] = []
        self.files: list[Path] = []

    @classmethod
    def find(cls, out_dir: Path, given: str | None = None) -> Sampler | None:
        """A sampler, where py-spy is installed (``given`` or on the path)."""
        path = given or shutil.which("py-spy")
        return cls(path, out_dir) if path else None

    def start(self, pids: list[int], seconds: float, label: str) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for pid in pids:
            for kind, extra in (("gil", ["--gil"]), ("active", [])):
                out = self.out_dir / f"pyspy_{label}_{kind}_{pid}.txt"
                cmd = [self.py_spy, "record", "--pid", str(pid), "--duration", str(int(seconds)),
                       "--rate", str(self.rate), "--format", "raw", "--output", str(out),
                       "--nonblocking", "--threads", *extra]  # fmt: skip
                self._running.append(
                    subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                )
                self.files.append(out)

    def dump(self, pid: int, label: str) -> None:
        """One stack dump of every thread, native frames too (one short pause)."""
        out = self.out_dir / f"pyspy_{label}_dump_{pid}.txt"
        with open(out, "wb") as sink:
            cmd = [self.py_spy, "dump", "--pid", str(pid), "--native"]
            subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, timeout=60, check=False)

    def wait(self) -> list[Path]:
        for process in self._running:
            process.wait(timeout=120)
        self._running.clear()
        return [f for f in self.files if f.exists()]


def frames(stack: str) -> tuple[str, list[str]]:
    """A collapsed stack's thread and its Python frames, outermost first,
    each as ``function (file)`` with the line dropped."""
    parts = stack.split(";")
    thread = "?"
    out = []
    for part in parts:
        if part.startswith("process "):
            continue
        if part.startswith("thread ("):
            thread = part
            continue
        found = FRAME.match(part)
        out.append(f"{found['name']} ({found['file']})" if found else part)
    return thread, out


def summarize(raw: Path, top: int = 40) -> dict[str, Any]:
    """Top functions of one collapsed-stack recording (see the module's doc)."""
    own: collections.Counter[str] = collections.Counter()
    anywhere: collections.Counter[str] = collections.Counter()
    lines: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = 0
    for row in raw.read_text().splitlines():
        stack, _, count = row.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        thread, names = frames(stack)
        threads[thread] += n
        if names:
            own[names[-1]] += n
            lines[stack.split(";")[-1]] += n
        for name in set(names):
            anywhere[name] += n

    def share(counter: collections.Counter[str]) -> list[list[Any]]:
        rows = counter.most_common(top)
        return [[name, n, round(100 * n / max(total, 1), 1)] for name, n in rows]

    return {
        "file": raw.name,
        "samples": total,
        "threads": share(threads),
        "self": share(own),
        "self_lines": share(lines),
        "inclusive": share(anywhere),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("raw", type=Path, nargs="+")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    report = {raw.name: summarize(raw, args.top) for raw in args.raw}
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
