"""Settings every test process needs before anything is imported, and the
tiers the suite is run in (docs/development.md)."""

import os
import shutil
import sys
from pathlib import Path

import pytest

# The minicpmo engine's Triton kernels run in Triton's interpreter on a
# machine without a GPU. Triton decides that for every @triton.jit function
# (its own, such as tl.sum, included) when it is first imported, which
# transformers' import of torch._dynamo does long before the kernels' module.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The servers, workers and tools the tests start (hundreds of processes) read
# their modules' compiled bytecode from __pycache__ instead of compiling every
# module again at each start, where the environment says not to write it.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# Under pytest-xdist the test processes share the cores: each one's math
# libraries (torch's, numpy's) on one thread, not on every core each.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1) > 1:
    for threads in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(threads, "1")

TESTS = Path(__file__).parent
# The pure tests (``make test-fast``): no server, browser or model started.
FAST_FOLDERS = {"unit"}
# Parallel runs hand whole modules to processes in the order collected: the
# longest first, so that none is left running alone at the end. A module's
# seconds in the last run are kept in pytest's cache; before any run, the
# folders whose modules run longest come first.
SECONDS_KEY = "omnilive/module_seconds"
FOLDER_ORDER = [
    "container",
    "minicpmo",
    "cascade",
    "browser",
    "security",
    "openai_clients",
    "integration",
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _folder(item.path) in FAST_FOLDERS:
            item.add_marker(pytest.mark.fast)
    cache = getattr(config, "cache", None)
    seconds: dict[str, float] = (cache.get(SECONDS_KEY, {}) if cache is not None else {}) or {}

    def cost(item: pytest.Item) -> tuple[float, int]:
        folder = _folder(item.path)
        rank = FOLDER_ORDER.index(folder) if folder in FOLDER_ORDER else len(FOLDER_ORDER)
        return (-seconds.get(_module(item.nodeid), 0.0), rank)

    items.sort(key=cost)  # stable: a module's tests keep their order


def _folder(path: Path) -> str:
    return path.relative_to(TESTS).parts[0] if path.is_relative_to(TESTS) else ""


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


_module_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each module's seconds, setup and teardown included (in a parallel run
    the reports of every process reach the controlling one)."""
    module = _module(report.nodeid)
    _module_seconds[module] = _module_seconds.get(module, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    cache = getattr(session.config, "cache", None)
    if cache is None or hasattr(session.config, "workerinput") or not _module_seconds:
        return  # a pytest-xdist worker: its controller keeps the figures
    kept = cache.get(SECONDS_KEY, {}) or {}
    cache.set(SECONDS_KEY, {**kept, **{k: round(v, 1) for k, v in _module_seconds.items()}})
