"""Local Kubernetes control plane for the end-to-end tests, the demo and the benchmarks.

``launcher`` starts etcd, kube-apiserver, kube-controller-manager (disruption controller
only) and kube-scheduler from binaries built by ``scripts/build-control-plane.sh``;
``nodes`` runs a hollow v1.37.2 kubelet per node (``rpw-node``, sources in ``node/``);
``webhook_process`` runs and registers the webhook service; ``doubles`` holds the test
doubles of the engine's ports, for the unit tests and the benchmarks. The rigs that the
tests and the benchmarks both drive live here too (``fault_rig``, ``flood``,
``cluster_flood``, ``compare``, ``hostile_clients``, ``review_cluster``); ``bench`` holds
only the benchmarks that run them and report. ``provenance`` writes every results file.
``python -m harness`` is the command line.
"""
