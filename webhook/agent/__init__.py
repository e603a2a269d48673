"""The node agent (``python -m webhook node-agent``, one per node, docs/checkpoint.md): it
publishes what its node can do for checkpoint and restore, turns the kubelet's checkpoint
archives into images in the container runtime, and deletes archives and images once a
restore is done or given up. It builds on :mod:`webhook.core` (and the settings' rules of
:mod:`webhook.base.settings`); the API server's store is
:class:`webhook.kube.checkpoints.PodCheckpoints`, handed in by the command line."""
