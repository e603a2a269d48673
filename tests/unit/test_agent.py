"""The node agent's passes on doubles of its store and runtime, with real archives on disk."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.doubles import PodCheckpointsInMemory, RuntimeInMemory
from tests.unit.test_agent_oci import make_archive, owner, spec
from webhook.agent.loop import LAYOUT_PREFIX, Agent, AgentConfig
from webhook.agent.oci import CHECKPOINT_ANNOTATION
from webhook.agent.runtime import (
    CriuFacts,
    RuntimeFacts,
    probe_criu,
    restore_enabled,
)
from webhook.agent.settings import load_agent_settings
from webhook.core.checkpoint import image_reference, rfc3339
from webhook.core.errors import InputError

NODE = "node-1"
NOW = 1_800_000_000.0
UID = "0f3c2a9e-1b2c-4d5e-8f90-123456789abc"


Store = PodCheckpointsInMemory


@dataclass
class Clock:
    now: float = NOW

    def __call__(self) -> float:
        return self.now


def listed_by_name(runtime: RuntimeInMemory) -> set[str]:
    """The images listed by name, not by id (``sha256:...``)."""
    return {n for n in runtime.image_names() if not n.startswith("sha256:")}


def usable_criu() -> CriuFacts:
    return CriuFacts("4.1.1", True)


def make_agent(
    tmp_path: Path, store: Store, runtime: RuntimeInMemory, clock: Clock, **limits: int
) -> Agent:
    config = AgentConfig(NODE, tmp_path, **limits)  # type: ignore[arg-type]
    return Agent(config, store, runtime, usable_criu, clock)


def archive(
    tmp_path: Path, pod: str, container: str, args: list[str] | None = None, uid: str = UID
) -> Path:
    """An archive as containerd writes it of ``container`` of pod ``uid``."""
    path = tmp_path / f"checkpoint-{pod}_team-a-{container}-2027-01-15T08:00:00Z.tar"
    dump = spec(args or ["sh", "-c", container], owner(uid, pod, container))
    return make_archive(path, {"spec.dump": dump, "pages": b"x" * 100})


def record(
    tmp_path: Path, pod: str = "worker", uid: str = UID, containers: tuple[str, ...] = ("main",),
    phase: str = "archived", at: float = NOW - 60, **status: Any,
) -> tuple[str, dict[str, Any]]:  # fmt: skip
    """A ``PodCheckpoint`` of ``pod`` on this node, as the service writes it."""
    archives = {c: str(archive(tmp_path, pod, c, uid=uid)) for c in containers}
    pod_json = {"metadata": {"namespace": "team-a", "name": pod, "uid": uid}, "spec": {}}
    spec = {"uid": uid, "node": NODE, "pod": pod_json, "archives": archives,
            "checkpointedAt": rfc3339(at)}  # fmt: skip
    return f"rpw-checkpoint-{uid}", {"spec": spec, "status": {"phase": phase, **status}}


def test_an_archived_record_becomes_imaged_and_its_archives_go(tmp_path: Path) -> None:
    name, data = record(tmp_path, containers=("main", "sidecar"))
    store, runtime = Store({name: data}), RuntimeInMemory()
    make_agent(tmp_path, store, runtime, Clock()).step()
    images = {c: image_reference("team-a", "worker", c, UID) for c in ("main", "sidecar")}
    after = store.items[name]["status"]
    assert "imaged" == after["phase"]
    assert images == after["images"]
    assert {"main": ["sh", "-c", "main"], "sidecar": ["sh", "-c", "sidecar"]} == after["commands"]
    # Each archive tar here is 10240 bytes (tar's blocking).
    assert {"main": 10240, "sidecar": 10240} == after["sizes"]
    assert rfc3339(NOW) == after["imagedAt"]
    assert set(images.values()) == listed_by_name(runtime)
    # Each image is a checkpoint image of its container, as containerd restores from it.
    assert {c: c for c in images} == {
        c: runtime.manifests[r]["annotations"][CHECKPOINT_ANNOTATION] for c, r in images.items()
    }
    assert [] == sorted(p.name for p in tmp_path.iterdir())


def test_the_reference_names_namespace_pod_container_and_the_uid() -> None:
    assert "localhost/resize-preemption-checkpoint/team-a/worker/main:0f3c2a9e-1b2" == (
        image_reference("team-a", "worker", "main", UID)
    )


@pytest.mark.parametrize(
    ("archives", "message"),
    [
        ({"main": "/etc/shadow"}, "is not in the checkpoint directory"),
        ({"main": "relative.tar"}, "is not in the checkpoint directory"),
        ({}, "names no pod or no archive"),
    ],
    ids=["outside-the-directory", "relative", "no-archive"],
)
def test_a_record_naming_no_archive_of_the_directory_fails(
    tmp_path: Path, archives: dict[str, str], message: str
) -> None:
    name, data = record(tmp_path)
    data["spec"]["archives"] = archives
    store, runtime = Store({name: data}), RuntimeInMemory()
    make_agent(tmp_path, store, runtime, Clock()).step()
    assert ("failed", set()) == (store.items[name]["status"]["phase"], runtime.image_names())
    assert message in store.items[name]["status"]["message"]
    assert rfc3339(NOW) == store.items[name]["status"]["failedAt"]


OTHER_UID = "9a8b7c6d-0000-4000-8000-00000000beef"


@pytest.mark.parametrize(
    ("owner_of_archive", "message"),
    [
        (owner(OTHER_UID, "victim2", "main"), "holds container main of pod team-a/victim2"),
        (owner(OTHER_UID, "worker", "main"), f"({OTHER_UID}), not main of team-a/worker"),
        (owner(UID, "worker", "sidecar"), "holds container sidecar of pod team-a/worker"),
        ({}, "holds container ? of pod ?/? (no uid)"),
    ],
    ids=["another-pod", "same-name-another-uid", "another-container", "no-annotations"],
)
def test_an_archive_of_another_pod_is_never_imaged_nor_deleted(
    tmp_path: Path, owner_of_archive: dict[str, str], message: str
) -> None:
    """The archive swap: a record naming an archive that is not its own pod's."""
    name, data = record(tmp_path)
    theirs = tmp_path / "checkpoint-victim2_team-a-main-2027-01-15T08:00:00Z.tar"
    make_archive(theirs, {"spec.dump": spec(["sh"], owner_of_archive), "pages": b"y" * 100})
    data["spec"]["archives"] = {"main": str(theirs)}
    store, runtime = Store({name: data}), RuntimeInMemory()
    clock = Clock(NOW)
    agent = make_agent(tmp_path, store, runtime, clock)
    agent.step()
    assert ("failed", set()) == (store.items[name]["status"]["phase"], runtime.image_names())
    assert message in store.items[name]["status"]["message"]

    clock.now = NOW + 301  # past the failed record's retention: it is cleaned up
    os.utime(theirs, (NOW + 300, NOW + 300))  # young: not the stray sweep's yet
    agent.step()

    assert name not in store.items
    assert theirs.exists()


def test_a_failed_import_removes_what_was_imported_and_says_why(tmp_path: Path) -> None:
    name, data = record(tmp_path, containers=("main", "sidecar"))
    runtime = RuntimeInMemory(fail_import_of=image_reference("team-a", "worker", "sidecar", UID))
    store = Store({name: data})
    make_agent(tmp_path, store, runtime, Clock()).step()
    assert "failed" == store.items[name]["status"]["phase"]
    assert (
        "imaging failed: `ctr images import` failed: no space left on device"
        == (store.items[name]["status"]["message"])
    )
    assert set() == runtime.image_names()
    # The archives stay until the record is cleaned up, and no image layout is left.
    assert [] == [p.name for p in tmp_path.iterdir() if p.name.startswith(LAYOUT_PREFIX)]
    assert 2 == len(list(tmp_path.glob("checkpoint-*.tar")))


def test_a_record_changed_meanwhile_is_not_overwritten_and_its_images_go(tmp_path: Path) -> None:
    name, data = record(tmp_path)
    store, runtime = Store({name: data}), RuntimeInMemory()
    store.stale.add(name)
    make_agent(tmp_path, store, runtime, Clock()).step()
    assert ("archived", set()) == (store.items[name]["status"]["phase"], runtime.image_names())
    assert 1 == len(list(tmp_path.glob("checkpoint-*.tar")))


@pytest.mark.parametrize("phase", ["restored", "abandoned"])
def test_a_finished_record_is_cleaned_up(tmp_path: Path, phase: str) -> None:
    name, data = record(tmp_path)
    store, runtime = Store({name: data}), RuntimeInMemory()
    agent = make_agent(tmp_path, store, runtime, Clock())
    agent.step()
    store.items[name]["status"]["phase"] = phase
    leftover = archive(tmp_path, "worker", "main")  # an archive the record still names
    agent.step()
    assert ({}, set(), False) == (store.items, runtime.image_names(), leftover.exists())


@pytest.mark.parametrize(
    ("age", "kept"), [(299.0, True), (300.0, False)], ids=["within-retention", "past-it"]
)
def test_a_failed_record_stays_to_be_read_then_goes(tmp_path: Path, age: float, kept: bool) -> None:
    name, data = record(tmp_path, phase="failed", failedAt=rfc3339(NOW - age), message="x")
    store = Store({name: data})
    make_agent(tmp_path, store, RuntimeInMemory(), Clock()).step()
    assert kept == (name in store.items)
    assert kept == any(tmp_path.glob("checkpoint-*.tar"))


@pytest.mark.parametrize(
    ("limits", "gone"),
    [
        ({"max_checkpoints": 2}, ["a"]),
        ({"max_checkpoints": 1}, ["a", "b"]),
        ({"max_checkpoints": 3}, []),
        ({"max_checkpoint_bytes": 2 * 10240 + 1}, ["a"]),
    ],
    ids=["one-over-count", "two-over-count", "within", "over-bytes"],
)
def test_the_oldest_pending_records_over_the_bounds_are_abandoned_and_cleaned(
    tmp_path: Path, limits: dict[str, int], gone: list[str]
) -> None:
    store = Store()
    for i, pod in enumerate(("a", "b", "c")):
        name, data = record(tmp_path, pod=pod, uid=f"{pod}-uid", at=NOW - 100 + i)
        store.items[name] = data
    runtime = RuntimeInMemory()
    make_agent(tmp_path, store, runtime, Clock(), **limits).step()
    # Each archive tar here is 10240 bytes.
    assert {10240} == {int(s) for d in store.items.values() for s in d["status"]["sizes"].values()}
    assert sorted(f"rpw-checkpoint-{p}-uid" for p in "abc" if p not in gone) == sorted(store.items)
    assert sorted(
        image_reference("team-a", p, "main", f"{p}-uid") for p in "abc" if p not in gone
    ) == (sorted(listed_by_name(runtime)))


def test_stray_archives_go_once_old_named_ones_stay(tmp_path: Path) -> None:
    name, data = record(tmp_path, phase="imaged", images={}, sizes={})
    named = Path(data["spec"]["archives"]["main"])
    old, young = archive(tmp_path, "old", "main"), archive(tmp_path, "young", "main")
    layout = tmp_path / f"{LAYOUT_PREFIX}x-main.tar"
    layout.write_bytes(b"left by a pass that died")
    other = tmp_path / "notes.txt"
    other.write_text("not ours")
    for path in (old, layout, other, named):
        os.utime(path, (NOW - 301, NOW - 301))
    os.utime(young, (NOW - 10, NOW - 10))
    make_agent(tmp_path, Store({name: data}), RuntimeInMemory(), Clock()).step()
    assert sorted([named.name, young.name, other.name]) == sorted(
        p.name for p in tmp_path.iterdir()
    )


@pytest.mark.parametrize(
    ("criu", "runtime", "expected"),
    [
        (CriuFacts("4.1.1", True), RuntimeFacts("containerd v2.3.7", True),
         {"checkpoint": "true", "restore": "true", "criu": "4.1.1", "message": ""}),
        (CriuFacts("", False, "CRIU: criu not found"), RuntimeFacts("containerd v2.3.7", True),
         {"checkpoint": "false", "restore": "false", "criu": "",
          "message": "CRIU: criu not found"}),
        (CriuFacts("4.1.1", True), RuntimeFacts("containerd v2.3.7", False, "not enabled"),
         {"checkpoint": "true", "restore": "false", "criu": "4.1.1", "message": "not enabled"}),
    ],
    ids=["both", "no-criu", "no-restore"],
)  # fmt: skip
def test_the_capability_says_what_the_node_can_do(
    tmp_path: Path, criu: CriuFacts, runtime: RuntimeFacts, expected: dict[str, str]
) -> None:
    store = Store()
    agent = Agent(
        AgentConfig(NODE, tmp_path), store, RuntimeInMemory(facts=runtime), lambda: criu, Clock()
    )
    agent.step()
    published = store.capabilities["node-1"]
    assert {**expected, "runtime": runtime.version, "updatedAt": rfc3339(NOW)} == published


ENABLED = '[plugins."io.containerd.cri.v1.runtime"]\nenable_experimental_restore_via_create = true'
OTHER = '[plugins."io.containerd.cri.v1.runtime"]\nrestrict_oom_score_adj = true'


@pytest.mark.parametrize(
    ("version", "config", "expected"),
    [
        ((2, 3, 7), ENABLED, True),
        ((2, 3, 7), OTHER, False),
        ((2, 3, 7), None, False),
        ((2, 3, 7), "not = [toml", False),
        ((2, 1, 0), None, True),
        ((2, 4, 0), ENABLED, False),
        ((), None, False),
    ],
    ids=["enabled", "not-enabled", "config-unreadable", "config-broken", "before-the-opt-in",
         "gone-in-2.4", "unknown-version"],
)  # fmt: skip
def test_restore_via_create_is_read_from_version_and_configuration(
    version: tuple[int, ...], config: str | None, expected: bool
) -> None:
    restore, why = restore_enabled(version, config)
    assert expected == restore
    assert (why == "") == expected


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        ({}, {}, "command line: --node is required (or RPW_NODE)"),
        ({"node": "Node_1"}, {}, "command line: --node='Node_1' must be a node name"),
        ({"node": "n", "max-checkpoints": "0"}, {},
         "--max-checkpoints='0' must be a whole number of at least 1"),
        ({"node": "n"}, {"RPW_MAX_CHECKPOINT_BYTES": "-1Gi"},
         "environment: RPW_MAX_CHECKPOINT_BYTES='-1Gi' must be a size"),
        ({"node": "n", "checkpoint-dir": "checkpoints"}, {},
         "--checkpoint-dir='checkpoints' must be an absolute path"),
        ({"node": "n", "poll-interval": "0"}, {},
         "--poll-interval='0' must be a number of seconds above 0"),
    ],
    ids=["no-node", "bad-node", "zero-checkpoints", "negative-bytes", "relative-dir", "zero-poll"],
)  # fmt: skip
def test_bad_settings_are_one_line(
    flags: dict[str, str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(InputError) as caught:
        load_agent_settings(env=env, flags=flags)
    assert message in str(caught.value)
    assert 1 == len(str(caught.value).splitlines())


def test_flags_win_over_the_environment() -> None:
    settings = load_agent_settings(
        env={"RPW_NODE": "node-2", "RPW_MAX_CHECKPOINT_BYTES": "1Gi"},
        flags={"node": "node-1", "max-checkpoints": "3"},
    )
    assert ("node-1", 3, 1024**3) == (
        settings.node,
        settings.max_checkpoints,
        settings.max_checkpoint_bytes,
    )


def test_the_checkpoint_directory_is_made_roots_alone(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoints"
    directory.mkdir(mode=0o755)
    agent = Agent(AgentConfig(NODE, directory), Store(), RuntimeInMemory(), usable_criu, Clock())
    agent.protect_directory()
    assert 0o700 == directory.stat().st_mode & 0o777


def fake_criu(tmp_path: Path, version: str, check_exit: int) -> str:
    script = tmp_path / "bin dir" / "criu"
    script.parent.mkdir()
    script.write_text(
        "#!/bin/sh\n"
        f'[ "$1" = --version ] && {{ echo "Version: {version}"; exit 0; }}\n'
        '[ "$1" = check ] && echo "Error (criu/cr-check.c:1): vdso bounds" >&2\n'
        f'[ "$1" = check ] && exit {check_exit}\n'
        "exit 1\n"
    )
    script.chmod(0o755)
    return shlex.quote(str(script))


@pytest.mark.parametrize(
    ("version", "check_exit", "expected"),
    [
        ("4.1.1", 0, CriuFacts("4.1.1", True)),
        ("3.15", 0, CriuFacts("3.15", False, "CRIU 3.15 is older than 3.16")),
        ("3.17.1", 1, CriuFacts(
            "3.17.1", False, "`criu check` failed: Error (criu/cr-check.c:1): vdso bounds")),
    ],
    ids=["usable", "too-old", "check-fails"],
)  # fmt: skip
def test_criu_is_usable_when_recent_and_its_check_passes(
    tmp_path: Path, version: str, check_exit: int, expected: CriuFacts
) -> None:
    assert expected == probe_criu(fake_criu(tmp_path, version, check_exit))
