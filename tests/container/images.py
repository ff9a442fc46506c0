"""Building omnilive's images and starting processes in them, for the
container check (``make container-check``, tests/container/test_image.py).

No image registry is reachable where the check runs, so the Dockerfile's
base image is made here: ``debootstrap`` installs Debian's minimal system
from Debian's own archive, trimmed as the official ``-slim`` images are, and
is imported under the very name the Dockerfile pulls. The Dockerfile is the
one a user builds anywhere; only its base came another way.

The sandbox these tests run in refuses ``podman run`` (it cannot set the
container's resource limits), so a built image is started with ``buildah
run --isolation chroot``: the image's root file system, user and
environment, the host's network.
"""

from __future__ import annotations

import configparser
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
# One build at a time on a machine, whichever test process or checkout asks:
# two at once would each make the base image and fight for the two cores.
LOCK = Path(tempfile.gettempdir()) / "omnilive-container-check.lock"
STANDIN_LABEL = "org.omnilive.standin"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# What the official slim images leave out (their dpkg excludes): documents,
# manual pages, translations.
SLIM_EXCLUDES = """\
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
"""
SLIM_LEFTOVERS = (
    "usr/share/doc/*/*",
    "usr/share/man/*",
    "usr/share/info/*",
    "usr/share/locale/*",
    "var/lib/apt/lists/*",
    "var/cache/apt/archives/*.deb",
    "var/cache/apt/*.bin",
    "var/log/*.log",
)
# The official images' apt settings: downloaded packages are deleted once
# installed, and no translations are fetched.
APT_CONFIG = {
    "docker-clean": (
        'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb '
        '/var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };\n'
        'APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb '
        '/var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };\n'
        'Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";\n'
    ),
    "docker-no-languages": 'Acquire::Languages "none";\n',
}
APT_SOURCES = """\
Types: deb
URIs: {mirror}
Suites: {suite} {suite}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: {suite}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


def container_tool() -> str | None:
    """``podman`` (builds) where both it and ``buildah`` (runs) are installed."""
    if shutil.which("podman") and shutil.which("buildah"):
        return "podman"
    return None


def base_image_name(dockerfile: Path = DOCKERFILE) -> str:
    """The default of the Dockerfile's ``ARG BASE_IMAGE``."""
    match = re.search(r"^ARG BASE_IMAGE=(\S+)$", dockerfile.read_text(), re.MULTILINE)
    assert match, f"{dockerfile} declares no ARG BASE_IMAGE default"
    return match.group(1)


def image_exists(name: str) -> bool:
    done = subprocess.run(["podman", "image", "exists", name], capture_output=True)
    return done.returncode == 0


def image_size_bytes(name: str) -> int:
    done = _check(["podman", "image", "inspect", "--format", "{{.Size}}", name])
    return int(done.stdout.strip())


def image_config(name: str) -> dict:
    """The image's configuration (user, environment, command...), with its
    health check, which podman shows beside the rest."""
    [inspected] = json.loads(_check(["podman", "image", "inspect", name]).stdout)
    return {**inspected["Config"], "Healthcheck": inspected.get("Healthcheck")}


def _check(command: list[str], **options) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, **options)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-4000:]}"
            f"\n{done.stderr[-4000:]}"
        )
    return done


@contextlib.contextmanager
def machine_lock() -> Iterator[None]:
    with open(LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def make_debian_base(name: str, log: Path) -> None:
    """A stand-in for ``debian:<suite>-slim`` from Debian's packages, tagged ``name``."""
    suite = name.rsplit(":", 1)[-1].removesuffix("-slim")
    with tempfile.TemporaryDirectory(prefix="omnilive-rootfs-", dir="/var/tmp") as tmp:
        root = Path(tmp) / "root"
        (root / "etc/dpkg/dpkg.cfg.d").mkdir(parents=True)
        # Written before debootstrap unpacks anything, so that it excludes
        # the documents as the slim image does, not just deletes them after.
        (root / "etc/dpkg/dpkg.cfg.d/slim").write_text(SLIM_EXCLUDES)
        with open(log, "ab") as out:
            done = subprocess.run(
                ["debootstrap", "--variant=minbase", suite, str(root), DEBIAN_MIRROR],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        if done.returncode != 0:
            raise RuntimeError(f"debootstrap {suite} exited {done.returncode}: see {log}")
        for setting, text in APT_CONFIG.items():
            (root / "etc/apt/apt.conf.d" / setting).write_text(text)
        (root / "etc/apt/sources.list").unlink(missing_ok=True)
        (root / "etc/apt/sources.list.d/debian.sources").write_text(
            APT_SOURCES.format(mirror=DEBIAN_MIRROR, suite=suite)
        )
        # What debootstrap unpacked before dpkg read the excludes, and its
        # downloads and logs.
        for pattern in SLIM_LEFTOVERS:
            for path in root.glob(pattern):
                if path.name in ("copyright", "locale.alias"):
                    continue
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        archive = Path(tmp) / "root.tar"
        _check(["tar", "--numeric-owner", "-C", str(root), "-cf", str(archive), "."])
        _check(
            [
                "podman",
                "import",
                "--change",
                'CMD ["bash"]',
                "--change",
                f"LABEL {STANDIN_LABEL}=debootstrap",
                str(archive),
                name,
            ]
        )


def tracked_tree(into: Path) -> Path:
    """The checkout as a fresh clone would have it: tracked files, and new
    ones git does not ignore, from the working tree (no .venv, data, caches)."""
    listed = _check(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO
    ).stdout
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if not source.is_file():  # deleted in the working tree, not yet in git
            continue
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return into


# pip's settings from this machine that make sense inside a build: where the
# index is and how to trust it, not its local paths (find-links, file:// indexes).
PIP_KEYS = ("index-url", "extra-index-url", "trusted-host", "proxy", "default-timeout", "cert")
LENT_AT = Path("/mnt")  # the Dockerfile's place for what a build is lent


def pip_settings(environ: dict[str, str], config_text: str) -> dict[str, str]:
    """This machine's pip settings for the build, from ``/etc/pip.conf`` and
    ``PIP_*`` variables (which win, as in pip)."""
    parser = configparser.ConfigParser()
    parser.read_string(config_text)
    found = dict(parser["global"]) if parser.has_section("global") else {}
    for key in PIP_KEYS:
        value = environ.get("PIP_" + key.upper().replace("-", "_"))
        if value:
            found[key] = value
    kept = {key: value for key, value in found.items() if key in PIP_KEYS}
    for key in ("index-url", "extra-index-url"):
        urls = [url for url in kept.get(key, "").split() if not url.startswith("file:")]
        kept.pop(key, None)
        if urls:
            kept[key] = " ".join(urls)
    return kept


def lend(share: Path) -> list[str]:
    """Options that lend the build, at /mnt (never stored in the image), the
    llama.cpp wheels the Makefile built here and this machine's pip settings
    with the certificate authorities pip here trusts: pip in the build then
    reaches the package index the way pip here does (behind a proxy that
    re-signs TLS, for one)."""
    share.mkdir(parents=True, exist_ok=True)
    wheels = Path.home() / ".cache/omnilive/wheels"
    if os.environ.get("OMNILIVE_CONTAINER_BUILD_LLAMA") != "1":
        for built in wheels.glob("llama-cpp-*"):
            if built.is_dir() and not built.name.endswith(".tmp"):
                shutil.copytree(built, share / built.name, dirs_exist_ok=True)
    host_config = Path("/etc/pip.conf")
    text = host_config.read_text() if host_config.is_file() else ""
    settings = pip_settings(dict(os.environ), text)
    cert = settings.pop("cert", None)
    if cert and Path(cert).is_file():
        shutil.copyfile(cert, share / "ca.crt")
        settings["cert"] = str(LENT_AT / "ca.crt")
    options = ["-v", f"{share}:{LENT_AT}:ro"]
    if settings:
        lines = "".join(f"{key} = {value}\n" for key, value in settings.items())
        (share / "pip.conf").write_text("[global]\n" + lines)
        options += ["--build-arg", f"PIP_CONFIG_FILE={LENT_AT / 'pip.conf'}"]
    return options


@dataclass(frozen=True)
class Build:
    image: str
    seconds: float
    log: Path


def build_image(context: Path, target: str, tag: str, log: Path) -> Build:
    """``podman build --isolation chroot`` of one target, at the lowest CPU
    priority (it shares the machine with the rest of the suite). Docker's
    image format keeps the Dockerfile's HEALTHCHECK, which OCI's lacks."""
    command = [
        "nice",
        "-n",
        "19",
        "podman",
        "build",
        "--isolation",
        "chroot",
        "--format",
        "docker",
        "--layers",
        "--target",
        target,
        "-t",
        tag,
        *lend(log.parent / "lent"),
        str(context),
    ]
    started = time.monotonic()
    with open(log, "ab") as out:
        out.write(f"$ {' '.join(command)}\n".encode())
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-6000:]
        raise RuntimeError(f"podman build --target {target} exited {done.returncode}:\n{tail}")
    return Build(tag, seconds, log)


class Container:
    """A working container of ``image`` (``buildah from``), removed on exit."""

    def __init__(self, image: str) -> None:
        self.image = image
        self.name = _check(["buildah", "from", "--pull-never", image]).stdout.strip()

    def _argv(self, command: list[str], env: dict[str, str]) -> list[str]:
        """``buildah run`` of ``command`` in this container on the host's network."""
        options = [item for key, value in env.items() for item in ("--env", f"{key}={value}")]
        network = ["--isolation", "chroot", "--network", "host"]
        return ["buildah", "run", *network, *options, self.name, "--", *command]

    def run(self, command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        """``command`` in the container on the host's network, its output in ``log``."""
        out = open(log, "ab")  # noqa: SIM115 - the process holds it; closed with the file
        try:
            return subprocess.Popen(
                self._argv(command, env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            out.close()

    def call(self, command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self._argv(command, env), capture_output=True, text=True, timeout=60)

    def remove(self) -> None:
        subprocess.run(["buildah", "rm", self.name], capture_output=True)


def _children() -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # The command's name (field 2) may hold spaces: the parent follows its ")".
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            found.setdefault(parent, []).append(int(stat.parent.name))
    return found


def main_process(process: subprocess.Popen[bytes], program: str) -> int | None:
    """The process ``buildah run`` started in the container: the first below it
    whose command line runs ``program``, or None while there is none yet.

    It is what ``docker stop`` signals (a container's first process). Under
    ``buildah run --isolation chroot`` it sits below buildah's runtime and
    exec helpers, and a signal to ``buildah run`` itself is not handed on:
    buildah kills the process outright."""
    children = _children()
    queue = list(children.get(process.pid, []))
    while queue:
        pid = queue.pop(0)
        with contextlib.suppress(OSError):
            argv = [
                a.decode(errors="replace")
                for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            ]
            helper = Path(argv[0]).name.startswith("buildah")  # its exec helper names it too
            if not helper and any(part.endswith(program) for part in argv[:2]):
                return pid
        queue.extend(children.get(pid, []))
    return None


def stop_group(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Kill what is left of a process started by :meth:`Container.run`."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout)
