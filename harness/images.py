"""The images a real node runs, built without a registry, and the ``images.tsv`` naming them.

``scripts/build-images.sh`` installs the tools (buildah, mmdebstrap, Debian's busybox-static,
gcc) and runs ``python -m harness.images build``; the launcher and the tests read the
result with :func:`read_images`, always by role, never by a hard-coded name.

Three images, each exported as an OCI archive carrying its full reference, so that
``ctr -n k8s.io images import`` names it:

1. ``sandbox``: ``registry.k8s.io/pause:3.10``, the Kubernetes module's own ``pause.c``,
   compiled static, one layer, entrypoint ``/pause``.
2. ``workload``: Debian's static busybox with a link per applet (sh, sleep, cat, df...).
3. ``product``: the repository's unchanged ``Dockerfile``. Its base,
   ``python:3.11-slim-bookworm``, cannot be pulled here: a stand-in made from Debian 12's
   packages with mmdebstrap is committed under that name in the builder's own storage, and
   the build never pulls.

Every image is cached under a key of its inputs (the recipe that builds it included), so a
warm machine rebuilds nothing, and a changed input rebuilds only the images it feeds.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import inspect
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, cast

Role = Literal["sandbox", "workload", "product"]
ROLES: Final[tuple[Role, ...]] = ("sandbox", "workload", "product")
TSV_NAME: Final = "images.tsv"
# Image directories kept in the cache (one per set of inputs, e.g. per source change).
KEEP_SETS: Final = 4

SANDBOX_REFERENCE: Final = "registry.k8s.io/pause:3.10"
WORKLOAD_REPOSITORY: Final = "localhost/debian-busybox-static"
#: The name `make image` gives the local build, which the chart and deploy/base run.
PRODUCT_REFERENCE: Final = "localhost/resize-preemption-webhook:0.1.0"
BASE_REFERENCE: Final = "docker.io/library/python:3.11-slim-bookworm"

# What the Dockerfile needs of its base: python 3.11 as `python`, venv with ensurepip,
# groupadd/useradd, and the CA certificates pip verifies its index with.
BASE_PACKAGES: Final = (
    "python3",
    "python3-venv",
    "python-is-python3",
    "passwd",
    "ca-certificates",
)
# The files that make the product image: what the Dockerfile copies, itself and the
# script that builds it.
PRODUCT_FILES: Final = (
    "Dockerfile",
    "pyproject.toml",
    "requirements-runtime.lock",
    "README.md",
    "scripts/build-image.sh",
)
PRODUCT_TREES: Final = ("webhook",)


class ImageBuildFailed(RuntimeError):
    """One image could not be built; the message names it."""


class ImagesUnavailable(RuntimeError):
    """An images directory is missing or its images.tsv is malformed."""


@dataclass(frozen=True)
class ImageArchive:
    """One line of images.tsv: an OCI archive (a file name in the images directory) and
    the full reference it carries."""

    reference: str
    file: str
    role: Role


def inputs_key(parts: Iterable[tuple[str, bytes]]) -> str:
    """A short digest of named inputs: the same names and contents give the same key in
    any order; renaming a part or changing one byte gives another."""
    digest = hashlib.sha256()
    for name, content in sorted(parts):
        encoded = name.encode()
        digest.update(b"%d:%s%d:" % (len(encoded), encoded, len(content)))
        digest.update(content)
    return digest.hexdigest()[:16]


def format_images_tsv(archives: Sequence[ImageArchive]) -> str:
    """The text of images.tsv: ``reference<TAB>file<TAB>role`` per line, one per role."""
    roles = [a.role for a in archives]
    if sorted(roles) != sorted(set(roles)):
        raise ValueError(f"one archive per role, got roles {roles}")
    for archive in archives:
        fields = (archive.reference, archive.file, archive.role)
        if any(not f or "\t" in f or "\n" in f for f in fields):
            raise ValueError(f"unwritable images.tsv fields {fields!r}")
    return "".join(f"{a.reference}\t{a.file}\t{a.role}\n" for a in archives)


def parse_images_tsv(text: str) -> dict[Role, ImageArchive]:
    """The archives of images.tsv by role. A malformed line, an unknown or repeated role
    raises ValueError naming the line."""
    archives: dict[Role, ImageArchive] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3 or not all(fields):
            raise ValueError(f"images.tsv line {number}: want reference, file, role: {line!r}")
        reference, file, role = fields
        if role not in ROLES:
            raise ValueError(f"images.tsv line {number}: unknown role {role!r}")
        if role in archives:
            raise ValueError(f"images.tsv line {number}: a second {role} image")
        if "/" in file:
            raise ValueError(f"images.tsv line {number}: {file!r} is not a file name")
        archives[cast(Role, role)] = ImageArchive(reference, file, cast(Role, role))
    return archives


def read_images(directory: Path) -> dict[Role, ImageArchive]:
    """The images directory printed by scripts/build-images.sh, checked: every role
    present and every archive there."""
    try:
        archives = parse_images_tsv((directory / TSV_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ImagesUnavailable(f"{directory}: {error}") from error
    missing = [role for role in ROLES if role not in archives]
    if missing:
        raise ImagesUnavailable(f"{directory / TSV_NAME} names no {', '.join(missing)} image")
    absent = [a.file for a in archives.values() if not (directory / a.file).is_file()]
    if absent:
        raise ImagesUnavailable(f"{directory}: archives missing: {', '.join(absent)}")
    return archives


def tree_files(root: Path, tree: str) -> Iterator[Path]:
    """The files of ``root/tree`` a build copies (no bytecode caches), sorted."""
    for path in sorted((root / tree).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            yield path


def tag_of_debian_version(version: str) -> str:
    """The upstream part of a Debian package version, as an image tag:
    ``1:1.35.0-4+b1`` -> ``1.35.0``."""
    upstream = version.split(":", 1)[-1].rsplit("-", 1)[0]
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in upstream)


# Building. Everything below runs tools; the functions above are pure.


@dataclass(frozen=True)
class Buildah:
    """buildah on a storage of its own under the cache (never the machine's default
    storage), overlay driver, every output on stderr."""

    root: Path

    def run(self, *args: str, capture: bool = False, quiet: bool = False) -> str:
        """buildah ``args``; ``capture``: return its output, ``quiet``: no error output
        either (a question whose "no" is an exit status)."""
        command = [
            "buildah",
            "--root",
            str(self.root / "storage"),
            "--runroot",
            str(self.root / "run"),
            "--storage-driver",
            "overlay",
            *args,
        ]
        out = subprocess.run(
            command,
            check=True,
            text=True,
            stdout=subprocess.PIPE if capture else sys.stderr,
            stderr=subprocess.DEVNULL if quiet else None,
        ).stdout
        return out.strip() if capture else ""

    def image_id(self, reference: str) -> str:
        """The image's ID in this storage, or "" when it holds no such image."""
        try:
            return self.run(
                "inspect",
                "--type",
                "image",
                "--format",
                "{{.FromImageID}}",
                reference,
                capture=True,
                quiet=True,
            )
        except subprocess.CalledProcessError:
            return ""

    def commit_scratch(self, layer: Path, reference: str, config: Sequence[str]) -> None:
        """An image of one layer (``layer``, a tar) on nothing, configured with the
        ``buildah config`` arguments ``config``."""
        container = self.run("from", "scratch", capture=True)
        try:
            self.run("add", container, str(layer), "/", capture=True)
            self.run("config", *config, container)
            self.run("commit", "--quiet", container, reference, capture=True)
        finally:
            self.run("rm", container, capture=True)

    def export(self, reference: str, archive: Path) -> None:
        """An OCI archive of the image whose index names it by its full reference."""
        partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")
        self.run(
            "push", "--quiet", "--format", "oci", reference, f"oci-archive:{partial}:{reference}"
        )
        partial.rename(archive)


@dataclass(frozen=True)
class Inputs:
    """What the images are built from, as found on this machine by build-images.sh."""

    cache: Path
    source_root: Path
    pause_c: Path
    pause_version: str
    busybox: Path
    busybox_version: str
    local_cas: Path

    @property
    def buildah(self) -> Buildah:
        return Buildah(self.cache)


def _run(command: Sequence[str]) -> str:
    return subprocess.run(command, check=True, text=True, stdout=subprocess.PIPE).stdout


def _layer(path: Path, entries: Iterable[tuple[str, Path | str | None, int]]) -> Path:
    """A tar owned by root: (name, source file | symlink target | None for a directory,
    mode)."""
    with tarfile.open(path, "w") as tar:
        for name, source, mode in entries:
            if isinstance(source, Path):
                info = tar.gettarinfo(str(source), arcname=name)
                info.mode = mode
            else:
                info = tarfile.TarInfo(name)
                info.type = tarfile.DIRTYPE if source is None else tarfile.SYMTYPE
                info.linkname = source or ""
                info.mode = mode
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            if isinstance(source, Path):
                with source.open("rb") as content:
                    tar.addfile(info, content)
            else:
                tar.addfile(info)
    return path


def build_sandbox(inputs: Inputs, work: Path) -> None:
    """pause.c compiled as the Kubernetes module's build/pause does, and packed as its
    Dockerfile packs it (one file, user 65535, entrypoint /pause)."""
    binary = work / "pause"
    _run(
        [
            "gcc",
            "-Os",
            "-Wall",
            "-Werror",
            "-static",
            f"-DVERSION={inputs.pause_version}",
            "-o",
            str(binary),
            str(inputs.pause_c),
        ]
    )
    layer = _layer(work / "layer.tar", [("pause", binary, 0o755)])
    inputs.buildah.commit_scratch(
        layer, SANDBOX_REFERENCE, ["--entrypoint", '["/pause"]', "--user", "65535:65535"]
    )


PASSWD: Final = (
    "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
)
GROUP: Final = "root:x:0:\nnogroup:x:65534:\n"


def build_workload(inputs: Inputs, work: Path) -> None:
    """Debian's static busybox at /bin/busybox, a symbolic link in /bin per applet, a
    world-writable /tmp and an /etc/passwd naming root and nobody."""
    applets = sorted(set(_run([str(inputs.busybox), "--list"]).split()) - {"busybox"})
    (work / "passwd").write_text(PASSWD, encoding="utf-8")
    (work / "group").write_text(GROUP, encoding="utf-8")
    entries: list[tuple[str, Path | str | None, int]] = [
        ("bin", None, 0o755),
        ("bin/busybox", inputs.busybox, 0o755),
        *((f"bin/{applet}", "busybox", 0o777) for applet in applets),
        ("etc", None, 0o755),
        ("etc/passwd", work / "passwd", 0o644),
        ("etc/group", work / "group", 0o644),
        ("tmp", None, 0o1777),
    ]
    layer = _layer(work / "layer.tar", entries)
    inputs.buildah.commit_scratch(
        layer, workload_reference(inputs), ["--env", "PATH=/bin", "--cmd", '["sh"]']
    )


def workload_reference(inputs: Inputs) -> str:
    return f"{WORKLOAD_REPOSITORY}:{tag_of_debian_version(inputs.busybox_version)}"


# Only the paths a slim Debian image keeps of the documentation (the licences).
_SLIM_DPKG = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
)
# pip inside the image (the venv's, from ensurepip) verifies its index against the
# system's CA bundle, as apt and every other tool there do, rather than its own copy.
PIP_CONF: Final = "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n"


def build_base(inputs: Inputs, work: Path) -> None:
    """The stand-in for python:3.11-slim-bookworm: Debian 12's minbase with BASE_PACKAGES
    from Debian's default mirror, the machine's own local CAs (/usr/local/share/ca-certificates)
    added to its trust store, and the environment the real image sets."""
    rootfs = work / "rootfs.tar"
    (work / "pip.conf").write_text(PIP_CONF, encoding="utf-8")
    hooks = [f"--customize-hook=copy-in {work / 'pip.conf'} /etc"]
    if any(inputs.local_cas.glob("**/*.crt")):
        hooks += [
            f"--customize-hook=copy-in {inputs.local_cas} /usr/local/share",
            '--customize-hook=chroot "$1" update-ca-certificates',
        ]
    _run_to_stderr(
        [
            "mmdebstrap",
            "--variant=minbase",
            "--include=" + ",".join(BASE_PACKAGES),
            *(f"--dpkgopt={option}" for option in _SLIM_DPKG),
            *hooks,
            "--skip=output/dev",
            "bookworm",
            str(rootfs),
        ]
    )
    inputs.buildah.commit_scratch(
        rootfs,
        BASE_REFERENCE,
        [
            "--env",
            "LANG=C.UTF-8",
            "--env",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--cmd",
            '["python3"]',
        ],
    )


def build_product(inputs: Inputs, work: Path) -> None:
    """The repository's Dockerfile as it is, by ``make image``'s own script, never
    pulling: its FROM finds the stand-in."""
    buildah = inputs.buildah
    tool = ["buildah", "--root", str(buildah.root / "storage"), "--runroot"]
    tool += [str(buildah.root / "run"), "--storage-driver", "overlay"]
    env = {
        **os.environ,
        "IMAGE": PRODUCT_REFERENCE,
        "CONTAINER_TOOL": " ".join(tool),
        "BUILD_FLAGS": "--pull=never --isolation chroot --network host",
    }
    script = inputs.source_root / "scripts" / "build-image.sh"
    subprocess.run([str(script)], check=True, stdout=sys.stderr, env=env)


def _run_to_stderr(command: Sequence[str]) -> None:
    subprocess.run(command, check=True, stdout=sys.stderr)


def log(message: str) -> None:
    print(f"[build-images] {message}", file=sys.stderr, flush=True)


Part = tuple[str, bytes]


def _recipe(*functions: Callable[..., object]) -> list[Part]:
    """The source of the functions that build an image: a changed recipe rebuilds it."""
    return [(f"recipe/{f.__name__}", inspect.getsource(f).encode()) for f in functions]


def sandbox_key(inputs: Inputs) -> str:
    return inputs_key(
        [
            ("pause.c", inputs.pause_c.read_bytes()),
            ("pause-version", inputs.pause_version.encode()),
            *_recipe(build_sandbox, _layer),
        ]
    )


def workload_key(inputs: Inputs) -> str:
    return inputs_key(
        [
            ("busybox", inputs.busybox.read_bytes()),
            ("busybox-version", inputs.busybox_version.encode()),
            *_recipe(build_workload, _layer),
        ]
    )


def base_key(inputs: Inputs) -> str:
    cas = sorted(inputs.local_cas.glob("**/*.crt"))
    return inputs_key(
        [
            ("packages", "\n".join(BASE_PACKAGES).encode()),
            ("slim", "\n".join(_SLIM_DPKG).encode()),
            ("pip.conf", PIP_CONF.encode()),
            *((f"ca/{ca.relative_to(inputs.local_cas)}", ca.read_bytes()) for ca in cas),
            *_recipe(build_base),
        ]
    )


def product_key(inputs: Inputs, base: str) -> str:
    root = inputs.source_root
    files = [root / name for name in (*PRODUCT_FILES, ".dockerignore")]
    files += [path for tree in PRODUCT_TREES for path in tree_files(root, tree)]
    return inputs_key(
        [
            ("base", base.encode()),
            *((str(path.relative_to(root)), path.read_bytes()) for path in files),
            *_recipe(build_product),
        ]
    )


def _build(inputs: Inputs, what: str, reference: str, steps: Callable[[Path], None]) -> float:
    """Runs ``steps`` in a scratch directory under the cache and returns how long they took.
    A failing tool becomes an ImageBuildFailed naming the image."""
    log(f"{what} {reference}: building")
    start = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(dir=inputs.cache) as work:
            steps(Path(work))
    except (subprocess.CalledProcessError, OSError) as error:
        detail = (
            f"{error.cmd[0]} exited {error.returncode}"
            if isinstance(error, subprocess.CalledProcessError)
            else str(error)
        )
        raise ImageBuildFailed(
            f"the {what} {reference} could not be built ({detail}; see above)"
        ) from error
    return time.monotonic() - start


def ensure_archive(
    inputs: Inputs, role: str, reference: str, key: str, build: Callable[[Inputs, Path], None]
) -> Path:
    """The OCI archive of one image under its key, built (and exported) when missing."""
    archive = inputs.cache / "archives" / f"{role}-{key}.tar"
    if archive.is_file():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)

    def build_and_export(work: Path) -> None:
        build(inputs, work)
        inputs.buildah.export(reference, archive)
        inputs.buildah.run("rmi", reference, capture=True)

    seconds = _build(inputs, f"{role} image", reference, build_and_export)
    log(f"{role} image: done in {seconds:.0f} s, {archive.stat().st_size / 1e6:.1f} MB")
    return archive


def ensure_base(inputs: Inputs, key: str) -> None:
    """The stand-in base in the builder's storage, rebuilt when its inputs changed."""
    record = inputs.cache / "archives" / f"base-{key}.id"
    present = inputs.buildah.image_id(BASE_REFERENCE)
    if present and record.is_file() and record.read_text(encoding="utf-8") == present:
        return
    record.parent.mkdir(parents=True, exist_ok=True)
    seconds = _build(inputs, "stand-in base", BASE_REFERENCE, lambda work: build_base(inputs, work))
    record.write_text(inputs.buildah.image_id(BASE_REFERENCE), encoding="utf-8")
    log(f"stand-in base: done in {seconds:.0f} s")


def build_all(inputs: Inputs) -> Path:
    """Every image's archive (built when its inputs changed) and the directory naming
    them: images.tsv and the archives, hard links into the archive store."""
    base = base_key(inputs)
    product = product_key(inputs, base)
    sandbox_archive = ensure_archive(
        inputs, "sandbox", SANDBOX_REFERENCE, sandbox_key(inputs), build_sandbox
    )
    workload_archive = ensure_archive(
        inputs, "workload", workload_reference(inputs), workload_key(inputs), build_workload
    )

    def build_product_on_base(inputs: Inputs, work: Path) -> None:
        ensure_base(inputs, base)
        build_product(inputs, work)

    product_archive = ensure_archive(
        inputs, "product", PRODUCT_REFERENCE, product, build_product_on_base
    )
    archives = {
        ImageArchive(SANDBOX_REFERENCE, "sandbox.tar", "sandbox"): sandbox_archive,
        ImageArchive(workload_reference(inputs), "workload.tar", "workload"): workload_archive,
        ImageArchive(PRODUCT_REFERENCE, "product.tar", "product"): product_archive,
    }
    directory = (
        inputs.cache
        / "sets"
        / inputs_key((a.role, stored.name.encode()) for a, stored in archives.items())
    )
    if not (directory / TSV_NAME).is_file():
        directory.mkdir(parents=True, exist_ok=True)
        for archive, stored in archives.items():
            (directory / archive.file).unlink(missing_ok=True)
            os.link(stored, directory / archive.file)
        (directory / TSV_NAME).write_text(format_images_tsv(list(archives)), encoding="utf-8")
    os.utime(directory)  # the most recently used directories are the ones prune() keeps
    return directory


def prune(cache: Path, keep: int = KEEP_SETS) -> list[Path]:
    """Removes all but the ``keep`` most recently made image directories, then every
    archive no remaining directory links to (a product archive per source change would
    otherwise pile up). Returns what it removed."""
    sets = sorted((cache / "sets").glob("*"), key=lambda d: d.stat().st_mtime, reverse=True)
    removed = sets[keep:]
    for directory in removed:
        shutil.rmtree(directory)
    for archive in sorted((cache / "archives").glob("*.tar")):
        if archive.stat().st_nlink == 1:
            archive.unlink()
            removed.append(archive)
    return removed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.images", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build what is missing; print the images directory")
    build.add_argument("--cache", type=Path, required=True)
    build.add_argument("--source-root", type=Path, required=True)
    build.add_argument("--pause-c", type=Path, required=True)
    build.add_argument("--pause-version", required=True)
    build.add_argument("--busybox", type=Path, required=True)
    build.add_argument("--busybox-version", required=True)
    build.add_argument("--local-cas", type=Path, default=Path("/usr/local/share/ca-certificates"))
    args = parser.parse_args(argv)
    inputs = Inputs(
        cache=args.cache.resolve(),
        source_root=args.source_root.resolve(),
        pause_c=args.pause_c,
        pause_version=args.pause_version,
        busybox=args.busybox,
        busybox_version=args.busybox_version,
        local_cas=args.local_cas,
    )
    inputs.cache.mkdir(parents=True, exist_ok=True)
    try:
        # One build at a time per cache: a second one waits, then finds everything built.
        with (inputs.cache / "lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            directory = build_all(inputs)
            prune(inputs.cache)
    except ImageBuildFailed as error:
        log(str(error))
        return 1
    except KeyboardInterrupt:
        # An archive is renamed into place only once whole: the next build starts over.
        log("interrupted")
        return 130
    print(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
