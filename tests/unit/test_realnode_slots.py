"""Two real nodes on one machine: what sets node-2 apart from node-1 in the configuration it
writes (pure), and that the teardown of one node takes only the processes of its own
state directory."""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.realnode import (
    NAT_CHAIN,
    NODE_1,
    NODE_BRIDGE,
    NODE_IP,
    POD_BRIDGE,
    STATE_DIR,
    NodePaths,
    NodeSlot,
    _kill_by_executable,
    cni_config,
    kubelet_config,
    nat_rules,
)


@dataclass(frozen=True)
class SlotCase:
    id: str
    slot: NodeSlot
    expected: tuple[str, Path, str, str, str, str, str, str, str | None, str]


SLOT_CASES = [
    SlotCase(
        "node-1-keeps-its-fixed-names",
        NODE_1,
        ("node-1", STATE_DIR, NODE_BRIDGE, POD_BRIDGE, NAT_CHAIN, NODE_IP, "198.18.1.0/24",
         "198.18.1.1", None, "kubepods"),
    ),
    SlotCase(
        "node-2-numbered-apart",
        NodeSlot(2),
        ("node-2", STATE_DIR.with_name(f"{STATE_DIR.name}-2"), "rpwnode1", "rpwpods1",
         "RPW-REALNODE-2", "198.18.0.2", "198.18.2.0/24", "198.18.2.1", "/rpw-node-2",
         "rpw-node-2"),
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", SLOT_CASES, ids=[c.id for c in SLOT_CASES])
def test_each_slot_has_its_own_names_and_places(case: SlotCase) -> None:
    slot = case.slot
    assert case.expected == (
        slot.name, slot.state_dir, slot.node_bridge, slot.pod_bridge, slot.nat_chain,
        slot.node_ip, slot.pod_subnet, slot.pod_gateway, slot.cgroup_root, slot.pod_cgroup,
    )  # fmt: skip


@pytest.mark.parametrize("index", [0, 201], ids=["zero", "past-the-address-range"])
def test_a_slot_outside_the_address_plan_is_refused(index: int) -> None:
    with pytest.raises(ValueError, match=f"not {index}"):
        NodeSlot(index)


def config_of(paths: NodePaths, slot: NodeSlot) -> dict[str, object]:
    return kubelet_config(
        paths,
        port=10250,
        healthz_port=10248,
        max_pods=110,
        feature_gates={},
        status_update_frequency=4.0,
        client_ca=paths.root / "ca.crt",
        slot=slot,
    )


def test_node_1s_kubelet_keeps_the_defaults_of_cgroup_root_and_pod_logs(tmp_path: Path) -> None:
    config = config_of(NodePaths(tmp_path), NODE_1)
    assert (NODE_IP, False, False) == (
        config["address"], "cgroupRoot" in config, "podLogsDir" in config
    )  # fmt: skip


def test_node_2s_kubelet_keeps_its_pods_cgroups_and_logs_apart(tmp_path: Path) -> None:
    config = config_of(NodePaths(tmp_path), NodeSlot(2))
    assert ("198.18.0.2", "/rpw-node-2", str(tmp_path / "pod-logs")) == (
        config["address"], config["cgroupRoot"], config["podLogsDir"]
    )  # fmt: skip


def test_node_2s_pods_get_their_own_bridge_and_subnet(tmp_path: Path) -> None:
    plugin = cni_config(NodePaths(tmp_path), NodeSlot(2))["plugins"][0]
    assert ("rpwpods1", [[{"subnet": "198.18.2.0/24", "gateway": "198.18.2.1"}]]) == (
        plugin["bridge"], plugin["ipam"]["ranges"]
    )  # fmt: skip


def test_node_2s_pods_reach_the_api_server_through_a_chain_of_their_own() -> None:
    new_chain, dnat, jump = nat_rules(6443, NodeSlot(2))
    assert ["-N", "RPW-REALNODE-2"] == new_chain
    assert ("RPW-REALNODE-2", "rpwpods1", "10.0.0.1/32", "127.0.0.1:6443") == (
        dnat[1], dnat[dnat.index("-i") + 1], dnat[dnat.index("-d") + 1],
        dnat[dnat.index("--to-destination") + 1],
    )  # fmt: skip
    assert ["-I", "PREROUTING", "-j", "RPW-REALNODE-2"] == jump


@dataclass(frozen=True)
class Sleeper:
    process: subprocess.Popen[bytes]
    reaper: threading.Thread  # waits for it: a killed child is gone, not a zombie


@pytest.fixture
def sleepers(tmp_path: Path) -> Iterator[dict[str, Sleeper]]:
    """One ``sleep`` working in each of two state directories, one naming the first on its
    command line from elsewhere, and one of neither."""
    ours, theirs = tmp_path / "node", tmp_path / "node-2"
    for directory in (ours, theirs):
        directory.mkdir()
    sleep = shutil.which("sleep")
    assert sleep is not None
    started = {
        "in-ours": subprocess.Popen([sleep, "60"], cwd=ours),
        # Its state directory only in its argv (its first word, which sleep ignores).
        "naming-ours": subprocess.Popen(
            [f"--config={ours}/config", "60"], executable=sleep, cwd=tmp_path
        ),
        "in-theirs": subprocess.Popen([sleep, "60"], cwd=theirs),
        "of-neither": subprocess.Popen([sleep, "60"], cwd=tmp_path),
    }
    sleepers = {
        name: Sleeper(process, threading.Thread(target=process.wait, daemon=True))
        for name, process in started.items()
    }
    for sleeper in sleepers.values():
        sleeper.reaper.start()
    yield sleepers
    for sleeper in sleepers.values():
        sleeper.process.kill()
        sleeper.reaper.join()


def test_teardown_kills_only_the_processes_of_its_own_state_directory(
    tmp_path: Path, sleepers: dict[str, Sleeper]
) -> None:
    sleep = shutil.which("sleep")
    assert sleep is not None
    killed = _kill_by_executable([Path(sleep)], tmp_path / "node")
    gone = {int(k.split()[-1]) for k in killed}
    for sleeper in sleepers.values():
        # A killed one is reaped at once; the others live on, and are not waited for.
        sleeper.reaper.join(timeout=5 if sleeper.process.pid in gone else 0.2)
    alive = sorted(name for name, s in sleepers.items() if s.reaper.is_alive())
    assert (["in-theirs", "of-neither"], 2) == (alive, len(killed))
