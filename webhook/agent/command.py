"""``python -m webhook node-agent``: the agent's loop around :class:`~webhook.agent.loop.Agent`,
given the settings and a store (the command line builds the API server's)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from webhook.agent.loop import Agent, AgentConfig
from webhook.agent.records import CheckpointStore, split_repository
from webhook.agent.registry import RegistryClient, RegistryFailure, RegistryImages, load_credentials
from webhook.agent.runtime import Containerd, ImageStore, LocalImages, Runtime, probe_criu
from webhook.agent.settings import AgentSettings
from webhook.core.errors import InputError, WebhookError

log = logging.getLogger(__name__)


def build_agent(
    settings: AgentSettings, store: CheckpointStore, clock: Callable[[], float] = time.time
) -> Agent:
    runtime = Containerd(
        ctr=settings.ctr,
        address=str(settings.containerd_address),
        namespace=settings.containerd_namespace,
        snapshotter=settings.snapshotter,
        config=Path(settings.containerd_config) if settings.containerd_config else None,
    )
    config = AgentConfig(
        node=settings.node,
        checkpoint_dir=settings.checkpoint_dir,
        max_checkpoints=settings.max_checkpoints,
        max_checkpoint_bytes=settings.max_checkpoint_bytes,
        probe_interval=settings.probe_interval,
        failed_retention=settings.failed_retention,
        stray_age=settings.stray_age,
    )
    images = image_store(settings, runtime)
    return Agent(config, store, runtime, lambda: probe_criu(settings.criu), clock, images)


def image_store(settings: AgentSettings, runtime: Runtime) -> ImageStore:
    """The node's runtime, or the registry when one is set; its CA and credentials files
    are read here, so that a missing one is a bad setting (one line, exit 2)."""
    if not settings.registry:
        return LocalImages(runtime)
    host, _ = split_repository(settings.registry)
    ca = Path(settings.registry_ca) if settings.registry_ca else None
    if ca is not None and not ca.is_file():
        raise InputError(f"--registry-ca={settings.registry_ca!r} is not a readable file")
    credentials = None
    if settings.registry_auth:
        try:
            credentials = load_credentials(Path(settings.registry_auth), host)
        except RegistryFailure as e:
            raise InputError(f"--registry-auth: {e}") from None
        if credentials is None:
            raise InputError(
                f"--registry-auth={settings.registry_auth!r} holds no entry for {host}"
            )
    client = RegistryClient(host, ca_file=ca, credentials=credentials)
    return RegistryImages(settings.registry, client, runtime)


def run_agent(agent: Agent, poll_interval: float, *, once: bool = False) -> int:
    """Pass after pass until SIGTERM or SIGINT; a pass that fails (the API server away, a
    runtime call) is logged and the next one tries again. The first pass publishes the
    capability logged here."""
    agent.protect_directory()
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    capability = agent.capability()
    log.info(
        "node agent on %s: checkpoint %s, restore %s (CRIU %s, %s)%s",
        agent.config.node,
        capability.checkpoint,
        capability.restore,
        capability.criu or "none",
        capability.runtime or "no runtime",
        f": {capability.message}" if capability.message else "",
    )
    while not stop.is_set():
        try:
            agent.step()
        except (WebhookError, OSError) as e:
            log.warning("pass failed: %s", e)
        if once:
            break
        stop.wait(poll_interval)
    return 0
