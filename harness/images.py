"""The images a real node runs, built without a registry, and the ``images.tsv`` naming them.

``scripts/build-images.sh`` installs the tools (buildah, mmdebstrap, Debian's busybox-static,
gcc) and runs ``python -m harness.images build``; the launcher and the tests read the
result with :func:`read_images`, always by role, never by a hard-coded name.

Three images, each exported as an OCI archive carrying its full reference, so that
``ctr -n k8s.io images import`` names it:

1. ``sandbox``: ``registry.k8s.io/pause:3.10``, the Kubernetes module's own ``pause.c``,
   compiled static, one layer, entrypoint ``/pause``.
2. ``workload``: Debian's static busybox with a link per applet (sh, sleep, cat, df...).
3. ``product``: the repository's unchanged ``Dockerfile``, by ``make image``'s own script
   with ``BASE=stand-in``: its base, ``python:3.11-slim-bookworm``, cannot be pulled here,
   so the stand-in made from Debian 12's packages (scripts/stand_in_base.py, shared with
   ``make image``) is committed under that name in the builder's own storage, and the build
   never pulls.

Every image is cached under a key of its inputs (the recipe that builds it included), so a
warm machine rebuilds nothing, and a changed input rebuilds only the images it feeds.
"""

from __future__ import annotations

import argparse
import fcntl
import inspect
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, cast

from scripts.stand_in_base import Buildah, context_parts, inputs_key
from scripts.stand_in_base import base_key as stand_in_key

Role = Literal["sandbox", "workload", "product"]
ROLES: Final[tuple[Role, ...]] = ("sandbox", "workload", "product")
TSV_NAME: Final = "images.tsv"
# Image directories kept in the cache (one per set of inputs, e.g. per source change).
KEEP_SETS: Final = 4

SANDBOX_REFERENCE: Final = "registry.k8s.io/pause:3.10"
WORKLOAD_REPOSITORY: Final = "localhost/debian-busybox-static"
#: The name `make image` gives the local build, which the chart and deploy/base run.
PRODUCT_REFERENCE: Final = "localhost/resize-preemption-webhook:0.1.0"


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


def tag_of_debian_version(version: str) -> str:
    """The upstream part of a Debian package version, as an image tag:
    ``1:1.35.0-4+b1`` -> ``1.35.0``."""
    upstream = version.split(":", 1)[-1].rsplit("-", 1)[0]
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in upstream)


# Building. Everything below runs tools; the functions above are pure.


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
    """The stand-in base's key (scripts/stand_in_base.py), the machine's local CAs included."""
    return stand_in_key(inputs.local_cas)


def build_product(inputs: Inputs, archive: Path) -> None:
    """The repository's Dockerfile as it is, by ``make image``'s own script on the stand-in
    base in this cache's storage (built there first when missing), never pulling; the script
    writes the archive."""
    env = {
        **os.environ,
        "IMAGE": PRODUCT_REFERENCE,
        "BASE": "stand-in",
        "BUILD_FLAGS": "",
        "IMAGE_STORE": str(inputs.cache),
        "IMAGE_ARCHIVE": str(archive),
        "RPW_LOCAL_CAS": str(inputs.local_cas),
    }
    script = inputs.source_root / "scripts" / "build-image.sh"
    subprocess.run([str(script)], check=True, stdout=sys.stderr, env=env)


def product_key(inputs: Inputs, base: str) -> str:
    return inputs_key(
        [("base", base.encode()), *context_parts(inputs.source_root), *_recipe(build_product)]
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
    inputs: Inputs, role: str, reference: str, key: str, build: Callable[[Inputs, Path, Path], None]
) -> Path:
    """The OCI archive of one image under its key, built when missing: ``build(inputs,
    scratch directory, archive)`` writes it, renamed into place only once whole."""
    archive = inputs.cache / "archives" / f"{role}-{key}.tar"
    if archive.is_file():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")
    seconds = _build(inputs, f"{role} image", reference, lambda work: build(inputs, work, partial))
    partial.rename(archive)
    log(f"{role} image: done in {seconds:.0f} s, {archive.stat().st_size / 1e6:.1f} MB")
    return archive


def exported(
    build: Callable[[Inputs, Path], None], reference: str
) -> Callable[[Inputs, Path, Path], None]:
    """``build``, which commits ``reference`` in the builder's storage, then its export to the
    archive and the name removed from the storage."""

    def build_and_export(inputs: Inputs, work: Path, archive: Path) -> None:
        build(inputs, work)
        inputs.buildah.export(reference, archive)
        inputs.buildah.run("rmi", reference, capture=True)

    return build_and_export


def build_all(inputs: Inputs) -> Path:
    """Every image's archive (built when its inputs changed) and the directory naming
    them: images.tsv and the archives, hard links into the archive store."""
    product = product_key(inputs, base_key(inputs))
    sandbox_archive = ensure_archive(
        inputs,
        "sandbox",
        SANDBOX_REFERENCE,
        sandbox_key(inputs),
        exported(build_sandbox, SANDBOX_REFERENCE),
    )
    workload = workload_reference(inputs)
    workload_archive = ensure_archive(
        inputs, "workload", workload, workload_key(inputs), exported(build_workload, workload)
    )
    product_archive = ensure_archive(
        inputs, "product", PRODUCT_REFERENCE, product, lambda i, _, a: build_product(i, a)
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
