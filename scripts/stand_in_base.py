"""The stand-in for the Dockerfile's base, ``python:3.11-slim-bookworm``, where it cannot be
pulled: Debian 12's packages made into an image with mmdebstrap and committed in a buildah
storage of our own under that name, so that the unchanged Dockerfile builds on it.

Used by ``make image`` (scripts/build-image.sh, when the base cannot be pulled or with
``BASE=stand-in``) and by the real node's images (harness/images.py, through that same
script), so both build on one base, cached under a key of its inputs:

    python3 scripts/stand_in_base.py ensure --store DIR --from python:3.11-slim-bookworm [--arch A]
    python3 scripts/stand_in_base.py key --source-root ROOT --field NAME=VALUE... [--arch A]
    python3 scripts/stand_in_base.py storage --store DIR [--arch A]
    python3 scripts/stand_in_base.py label

``ensure`` builds the base when its key changed (as root: mmdebstrap and buildah's overlay
storage need it); ``key`` prints the key of an image built on it from the source tree
(the files the Dockerfile copies, the base's key and the given fields); ``storage`` prints
the buildah storage root the base of that architecture is in; ``label`` prints the label
that marks such an image, ``NAME=VALUE``. Standard library only: ``make image`` runs it
with the machine's python3.

``--arch`` is a Debian architecture of ARCHITECTURES, by default the machine's own. The
base of the machine's architecture is in the storage under DIR itself; another's (a foreign
one, its packages' scripts run under QEMU through binfmt_misc, which scripts/lib.sh's
``ensure_emulation`` sets up) is in a storage of its own under DIR/platforms/ARCH, because
each is committed under the Dockerfile's base name, which a storage holds once: the
Dockerfile then builds unchanged for either, and both stay cached side by side.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import inspect
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

#: The Dockerfile's base, fully qualified: the name the stand-in is committed under.
BASE_REFERENCE: Final = "docker.io/library/python:3.11-slim-bookworm"
#: The stand-in's own name too, and the value of the label marking an image built on it.
STAND_IN_REFERENCE: Final = "localhost/stand-in/python:3.11-slim-bookworm"
STAND_IN_LABEL: Final = "org.opencontainers.image.base.name"
DEFAULT_LOCAL_CAS: Final = Path("/usr/local/share/ca-certificates")
#: The Debian architectures the stand-in is made for, with the OCI platform each is.
ARCHITECTURES: Final = {"amd64": "linux/amd64", "arm64": "linux/arm64"}

# What the Dockerfile needs of its base: python 3.11 as `python`, venv with ensurepip,
# groupadd/useradd, and the CA certificates pip verifies its index with.
BASE_PACKAGES: Final = (
    "python3",
    "python3-venv",
    "python-is-python3",
    "passwd",
    "ca-certificates",
)
# The files that make an image of the product: what the Dockerfile copies, itself and the
# scripts that build it.
PRODUCT_FILES: Final = (
    "Dockerfile",
    "pyproject.toml",
    "requirements-runtime.lock",
    "README.md",
    "scripts/build-image.sh",
    "scripts/stand_in_base.py",
)
PRODUCT_TREES: Final = ("webhook",)

# Only the paths a slim Debian image keeps of the documentation (the licences).
SLIM_DPKG: Final = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
)
# pip inside the image (the venv's, from ensurepip) verifies its index against the
# system's CA bundle, as apt and every other tool there do, rather than its own copy.
PIP_CONF: Final = "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n"


def inputs_key(parts: Iterable[tuple[str, bytes]]) -> str:
    """A short digest of named inputs: the same names and contents give the same key in
    any order; renaming a part or changing one byte gives another."""
    digest = hashlib.sha256()
    for name, content in sorted(parts):
        encoded = name.encode()
        digest.update(b"%d:%s%d:" % (len(encoded), encoded, len(content)))
        digest.update(content)
    return digest.hexdigest()[:16]


def tree_files(root: Path, tree: str) -> Iterator[Path]:
    """The files of ``root/tree`` a build copies (no bytecode caches), sorted."""
    for path in sorted((root / tree).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            yield path


def context_parts(root: Path) -> list[tuple[str, bytes]]:
    """What an image of the product is made from in the source tree, as named parts."""
    files = [root / name for name in (*PRODUCT_FILES, ".dockerignore")]
    files += [path for tree in PRODUCT_TREES for path in tree_files(root, tree)]
    return [(str(path.relative_to(root)), path.read_bytes()) for path in files]


def qualified(image: str) -> str:
    """A Docker Hub short name as containers/image resolves it: ``python:3.11`` ->
    ``docker.io/library/python:3.11``."""
    first, _, rest = image.partition("/")
    if not rest:
        return f"docker.io/library/{image}"
    if "." in first or ":" in first or first == "localhost":
        return image
    return f"docker.io/{image}"


@dataclass(frozen=True)
class Buildah:
    """buildah on a storage of its own under ``root`` (never the machine's default
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
        self.run(
            "push", "--quiet", "--format", "oci", reference, f"oci-archive:{archive}:{reference}"
        )


def native_arch() -> str:
    """The machine's Debian architecture (amd64 on x86-64)."""
    return subprocess.run(
        ["dpkg", "--print-architecture"], check=True, text=True, stdout=subprocess.PIPE
    ).stdout.strip()


def build_base(buildah: Buildah, local_cas: Path, work: Path, arch: str) -> None:
    """Debian 12's minbase for ``arch`` with BASE_PACKAGES from Debian's default mirror, the
    machine's own local CAs (/usr/local/share/ca-certificates) added to its trust store, and
    the environment the real image sets; committed as BASE_REFERENCE and STAND_IN_REFERENCE,
    its configuration naming ``arch`` (what buildah's --platform matches)."""
    rootfs = work / "rootfs.tar"
    (work / "pip.conf").write_text(PIP_CONF, encoding="utf-8")
    hooks = [f"--customize-hook=copy-in {work / 'pip.conf'} /etc"]
    if any(local_cas.glob("**/*.crt")):
        hooks += [
            f"--customize-hook=copy-in {local_cas} /usr/local/share",
            '--customize-hook=chroot "$1" update-ca-certificates',
        ]
    subprocess.run(
        [
            "mmdebstrap",
            f"--architectures={arch}",
            "--variant=minbase",
            "--include=" + ",".join(BASE_PACKAGES),
            *(f"--dpkgopt={option}" for option in SLIM_DPKG),
            *hooks,
            "--skip=output/dev",
            "bookworm",
            str(rootfs),
        ],
        check=True,
        stdout=sys.stderr,
    )
    buildah.commit_scratch(
        rootfs,
        BASE_REFERENCE,
        [
            "--os",
            "linux",
            "--arch",
            arch,
            "--env",
            "LANG=C.UTF-8",
            "--env",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--cmd",
            '["python3"]',
        ],
    )
    buildah.run("tag", BASE_REFERENCE, STAND_IN_REFERENCE)


def base_key(local_cas: Path, arch: str | None = None) -> str:
    """The key of the stand-in: its architecture (by default the machine's), packages,
    exclusions, pip configuration, the machine's local CA files and the recipe."""
    cas = sorted(local_cas.glob("**/*.crt"))
    return inputs_key(
        [
            ("arch", (arch or native_arch()).encode()),
            ("packages", "\n".join(BASE_PACKAGES).encode()),
            ("slim", "\n".join(SLIM_DPKG).encode()),
            ("pip.conf", PIP_CONF.encode()),
            *((f"ca/{ca.relative_to(local_cas)}", ca.read_bytes()) for ca in cas),
            ("recipe/build_base", inspect.getsource(build_base).encode()),
        ]
    )


def log(message: str) -> None:
    print(f"[stand-in base] {message}", file=sys.stderr, flush=True)


def storage_root(store: Path, arch: str | None = None) -> Path:
    """The buildah storage root holding the stand-in for ``arch`` (by default the machine's):
    ``store`` itself for the machine's architecture, ``store/platforms/ARCH`` for another."""
    if arch is None or arch == native_arch():
        return store
    return store / "platforms" / arch


def ensure_base(store: Path, local_cas: Path, arch: str | None = None) -> None:
    """The stand-in for ``arch`` (by default the machine's) in its buildah storage under
    ``store`` (:func:`storage_root`), built when its key changed. One build at a time per
    storage (a second caller waits, then finds it built; an arm64 stand-in's minutes under
    emulation hold up no build of the machine's own)."""
    arch = arch or native_arch()
    root = storage_root(store, arch)
    root.mkdir(parents=True, exist_ok=True)
    buildah = Buildah(root)
    key = base_key(local_cas, arch)
    record = store / "archives" / f"base-{key}.id"
    with (root / "base.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        present = buildah.image_id(BASE_REFERENCE)
        if present and record.is_file() and record.read_text(encoding="utf-8") == present:
            return
        log(f"{BASE_REFERENCE} for {arch}: building it from Debian 12's packages")
        start = time.monotonic()
        with tempfile.TemporaryDirectory(dir=store) as work:
            build_base(buildah, local_cas, Path(work), arch)
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(buildah.image_id(BASE_REFERENCE), encoding="utf-8")
        log(f"done in {time.monotonic() - start:.0f} s")


def image_key(
    root: Path, local_cas: Path, fields: Sequence[str], arch: str | None = None
) -> str:
    """The key of an image built on the stand-in for ``arch`` (by default the machine's):
    the source tree's build inputs, the base's key and ``fields`` (NAME=VALUE: its
    reference, labels, build flags)."""
    return inputs_key(
        [
            *context_parts(root),
            ("base", base_key(local_cas, arch).encode()),
            *((f"field/{field.partition('=')[0]}", field.encode()) for field in fields),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stand_in_base.py", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    ensure = sub.add_parser("ensure", help="build the stand-in when missing or out of date")
    key = sub.add_parser("key", help="print the key of an image built on the stand-in")
    storage = sub.add_parser("storage", help="print the storage root of an architecture's base")
    sub.add_parser("label", help="print the label marking an image built on the stand-in")
    for command in (ensure, key):
        command.add_argument("--local-cas", type=Path, default=DEFAULT_LOCAL_CAS)
    for command in (ensure, key, storage):
        command.add_argument(
            "--arch", choices=sorted(ARCHITECTURES), help="Debian architecture (the machine's)"
        )
    for command in (ensure, storage):
        command.add_argument("--store", type=Path, required=True)
    ensure.add_argument("--from", dest="base", required=True, help="the Dockerfile's base")
    key.add_argument("--source-root", type=Path, required=True)
    key.add_argument("--field", action="append", default=[], help="NAME=VALUE")
    args = parser.parse_args(argv)
    if args.command == "label":
        print(f"{STAND_IN_LABEL}={STAND_IN_REFERENCE}")
        return 0
    if args.command == "key":
        print(image_key(args.source_root, args.local_cas, args.field, args.arch))
        return 0
    if args.command == "storage":
        print(storage_root(args.store.resolve(), args.arch))
        return 0
    if qualified(args.base) != BASE_REFERENCE:
        log(f"the Dockerfile builds on {args.base}; the stand-in is {BASE_REFERENCE} only")
        return 2
    try:
        ensure_base(args.store.resolve(), args.local_cas, args.arch)
    except (subprocess.CalledProcessError, OSError) as error:
        log(f"{BASE_REFERENCE} could not be built ({error}; see above)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
