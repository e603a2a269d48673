"""The node agent's work, one pass at a time (:meth:`Agent.step`), on its ports only: the
record store (:class:`~webhook.agent.records.CheckpointStore`), the runtime
(:class:`~webhook.agent.runtime.Runtime`) and the checkpoint directory of its node.

A pass:

1. publishes the node's capability every ``probe_interval`` seconds;
2. turns each ``archived`` record into images, each archive only when it holds that
   container of the record's own pod (containerd's annotations, the pod's uid): per
   container an OCI image layout written
   beside the archive (:func:`~webhook.agent.oci.write_image_layout`), stored (imported
   into the runtime, or pushed to a registry: :class:`~webhook.agent.runtime.ImageStore`),
   removed; the command read from the archive; then the archives are deleted and the record says
   ``imaged`` (or ``failed`` with one line, and whatever it imported is removed again);
3. cleans up ``restored``, ``abandoned`` and - after ``failed_retention`` seconds, for
   the service to read why - ``failed`` records: images, archives, the record;
4. keeps the node within ``max_checkpoints`` pending records and ``max_checkpoint_bytes``:
   the oldest is set ``abandoned`` with a message, then cleaned;
5. deletes archives (and layouts of a pass that died) no record names, once older than
   ``stray_age``;
6. every ``probe_interval``, removes what the image store left on this node for records
   that ended elsewhere (a copy pulled here for a pod restored from a registry).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from webhook.agent.oci import (
    ArchiveError,
    Owner,
    owner_of,
    process_args,
    spec_dump,
    write_image_layout,
)
from webhook.agent.records import CheckpointStore, one_line
from webhook.agent.runtime import (
    CriuFacts,
    ImageStore,
    LocalImages,
    Runtime,
    RuntimeFacts,
    RuntimeFailure,
)
from webhook.core.checkpoint import (
    FINISHED,
    PENDING,
    CheckpointRecord,
    NodeCheckpointing,
    Phase,
    parse_rfc3339,
    rfc3339,
)

log = logging.getLogger(__name__)

#: Written beside an archive while it becomes an image: process memory too, so only ever in
#: the checkpoint directory, and removed by the stray sweep if a pass dies.
LAYOUT_PREFIX = ".rpw-image-"


@dataclass(frozen=True)
class AgentConfig:
    node: str
    checkpoint_dir: Path
    max_checkpoints: int = 10
    max_checkpoint_bytes: int = 20 * 1024**3
    probe_interval: float = 300.0
    failed_retention: float = 300.0
    stray_age: float = 300.0


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        store: CheckpointStore,
        runtime: Runtime,
        criu: Callable[[], CriuFacts],
        clock: Callable[[], float],
        images: ImageStore | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.runtime = runtime
        #: Where images go: the runtime's store unless a registry is set.
        self.images: ImageStore = images if images is not None else LocalImages(runtime)
        self.criu = criu
        self.clock = clock
        self._probed_at: float | None = None
        self._swept_at: float | None = None

    def protect_directory(self) -> None:
        """The checkpoint directory as the kubelet makes it, root's alone (0700): the
        archives hold process memory. A hostPath volume made before the kubelet's first
        checkpoint would be 0755 otherwise."""
        try:
            self.config.checkpoint_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.config.checkpoint_dir, 0o700)
        except OSError as e:
            log.warning("checkpoint directory %s: %s", self.config.checkpoint_dir, e)

    # --- capability -----------------------------------------------------------------------

    def capability(self) -> NodeCheckpointing:
        criu = self.criu()
        facts: RuntimeFacts = self.runtime.probe()
        restore = criu.usable and facts.restore
        why = one_line("; ".join(m for m in (criu.message, facts.message) if m))
        node = self.config.node
        return NodeCheckpointing(node, criu.usable, restore, criu.version, facts.version, why)

    def publish(self) -> NodeCheckpointing:
        capability = self.capability()
        self.store.publish(capability, self.clock())
        self._probed_at = self.clock()
        return capability

    # --- one pass -------------------------------------------------------------------------

    def step(self) -> None:
        now = self.clock()
        if self._probed_at is None or now - self._probed_at >= self.config.probe_interval:
            self.publish()
        node = self.config.node
        for record in self.store.records_on(node):
            if record.phase is Phase.ARCHIVED:
                self.image(record)
        for record in self.over_bounds(self.store.records_on(node)):
            self.abandon(record)
        for record in self.store.records_on(node):
            if self.finished(record, now):
                self.clean(record)
        self.sweep(self.store.records_on(node), now)
        if self._swept_at is None or now - self._swept_at >= self.config.probe_interval:
            self.sweep_images(now)

    def sweep_images(self, now: float) -> None:
        """What the image store left on this node for records of other nodes (a pod
        restored here from a registry), every ``probe_interval``."""
        try:
            removed = self.images.sweep()
        except RuntimeFailure as e:
            log.warning("images of ended checkpoints not swept yet: %s", e)
            return
        self._swept_at = now
        for name in removed:
            log.info("removed %s: its checkpoint ended", name)

    def finished(self, record: CheckpointRecord, now: float) -> bool:
        if record.phase not in FINISHED:
            return False
        if record.phase is not Phase.FAILED:
            return True
        failed_at = parse_rfc3339(record.failed_at) or 0.0
        return now - failed_at >= self.config.failed_retention

    # --- archived -> imaged ---------------------------------------------------------------

    def archive_path(self, path: str) -> Path:
        """The archive the record names, which must be a file directly in the checkpoint
        directory: the agent runs as root, and acts on no path it did not check."""
        candidate = Path(path)
        directory = self.config.checkpoint_dir.resolve()
        if not candidate.is_absolute() or candidate.resolve().parent != directory:
            raise ArchiveError(f"{path} is not in the checkpoint directory {directory}")
        return candidate.resolve()

    def image(self, record: CheckpointRecord) -> None:
        namespace, pod, uid = record.namespace, record.pod_name, record.uid
        archives = record.archives
        imported: list[str] = []
        try:
            if not (namespace and pod and archives):
                raise ArchiveError("the record names no pod or no archive")
            images, commands, sizes = {}, {}, {}
            for container, path in sorted(archives.items()):
                archive = self.archive_path(path)
                reference = self.images.reference(namespace, pod, container, uid)
                commands[container] = self._args_of(record, container, archive)
                sizes[container] = archive.stat().st_size
                self._import(archive, reference, container, uid)
                imported.append(reference)
                images[container] = reference
        except (ArchiveError, RuntimeFailure, OSError) as e:
            for reference in imported:
                self._remove_image(reference)
            message = one_line(f"imaging failed: {e}")
            log.warning("checkpoint %s: %s", record.name, message)
            failed = rfc3339(self.clock())
            self._update(replace(record, phase=Phase.FAILED, message=message, failed_at=failed))
            return
        imaged = replace(
            record,
            phase=Phase.IMAGED,
            images=images,
            commands=commands,
            sizes=sizes,
            imaged_at=rfc3339(self.clock()),
            message="",
        )
        if not self._update(imaged):
            for reference in imported:
                self._remove_image(reference)
            return
        # After the record says so: a pass that dies in between leaves archives the
        # record's clean-up deletes, never a record naming archives that are gone.
        for path in archives.values():
            self._unlink(Path(path))
        log.info("checkpoint %s imaged: %s", record.name, ", ".join(sorted(images.values())))

    @staticmethod
    def _args_of(record: CheckpointRecord, container: str, archive: Path) -> list[str]:
        """The process arguments of ``container``'s archive, which must hold that
        container of the record's own pod (its uid, as containerd annotated the process):
        an archive of another pod never becomes this record's image."""
        spec = spec_dump(archive)
        found = owner_of(spec)
        wanted = Owner(record.namespace, record.pod_name, record.uid, container)
        if found != wanted:
            raise ArchiveError(
                f"{archive.name} holds container {found.container or '?'} of pod "
                f"{found.namespace or '?'}/{found.pod or '?'} ({found.uid or 'no uid'}), "
                f"not {container} of {record.key} ({record.uid})"
            )
        return process_args(archive, spec)

    def _import(self, archive: Path, reference: str, container: str, uid: str) -> None:
        layout = archive.parent / f"{LAYOUT_PREFIX}{uid}-{container}.tar"
        try:
            write_image_layout(archive, layout, reference=reference, container=container)
            self.images.store(layout, reference)
        finally:
            self._unlink(layout)

    # --- clean-up -------------------------------------------------------------------------

    def clean(self, record: CheckpointRecord) -> None:
        """Images, archives left, then the record; a runtime failure leaves the record for
        the next pass."""
        try:
            for reference in record.images.values():
                self.images.remove(reference)
        except RuntimeFailure as e:
            log.warning("checkpoint %s: images not removed yet: %s", record.name, e)
            return
        for container, path in record.archives.items():
            try:
                archive = self.archive_path(path)
                if archive.exists():
                    self._args_of(record, container, archive)
            except (ArchiveError, OSError) as e:
                # Another pod's archive stays: the sweep takes it once no record names it.
                log.warning("checkpoint %s: archive kept: %s", record.name, e)
                continue
            self._unlink(archive)
        self.store.delete(record.name)
        log.info("checkpoint %s (%s) cleaned up", record.name, record.phase)

    def over_bounds(self, records: list[CheckpointRecord]) -> list[CheckpointRecord]:
        """The oldest pending records to abandon so that at most ``max_checkpoints`` and
        ``max_checkpoint_bytes`` remain."""
        pending = sorted(
            (r for r in records if r.phase in PENDING), key=lambda r: (r.checkpointed_at, r.name)
        )
        sizes = [self.size(r) for r in pending]
        count, total = len(pending), sum(sizes)
        dropped: list[CheckpointRecord] = []
        for record, size in zip(pending, sizes, strict=True):
            if count <= self.config.max_checkpoints and total <= self.config.max_checkpoint_bytes:
                break
            dropped.append(record)
            count, total = count - 1, total - size
        return dropped

    def size(self, record: CheckpointRecord) -> int:
        """Bytes a pending record holds on the node: its images' sizes when imaged, its
        archives' when archived."""
        if record.phase is Phase.IMAGED:
            return sum(record.sizes.values())
        total = 0
        for path in record.archives.values():
            try:
                total += self.archive_path(path).stat().st_size
            except (ArchiveError, OSError):
                continue
        return total

    def abandon(self, record: CheckpointRecord) -> None:
        limits = (
            f"{self.config.max_checkpoints} checkpoints, {self.config.max_checkpoint_bytes} bytes"
        )
        message = f"abandoned by the node agent: node {self.config.node} keeps at most {limits}"
        log.warning("checkpoint %s: %s", record.name, message)
        self._update(replace(record, phase=Phase.ABANDONED, message=message))

    def _update(self, record: CheckpointRecord) -> bool:
        if self.store.update(record):
            return True
        log.info("checkpoint %s changed meanwhile; read again next pass", record.name)
        return False

    def sweep(self, records: list[CheckpointRecord], now: float) -> list[Path]:
        """Delete archives no record names and image layouts left behind, once older than
        ``stray_age``."""
        named = {Path(p).name for r in records for p in r.archives.values()}
        removed = []
        try:
            entries = list(self.config.checkpoint_dir.iterdir())
        except OSError:
            return []
        for entry in entries:
            ours = entry.name.startswith(LAYOUT_PREFIX) or (
                entry.name.startswith("checkpoint-") and entry.name.endswith(".tar")
            )
            if not ours or entry.name in named or not entry.is_file():
                continue
            try:
                age = now - entry.stat().st_mtime
            except OSError:
                continue
            if age >= self.config.stray_age:
                self._unlink(entry)
                removed.append(entry)
                log.info("deleted %s: no checkpoint record names it", entry)
        return removed

    def _remove_image(self, reference: str) -> None:
        try:
            self.images.remove(reference)
        except RuntimeFailure as e:
            log.warning("image %s not removed: %s", reference, e)

    @staticmethod
    def _unlink(path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
