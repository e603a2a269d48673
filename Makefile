# Every entry point a person or CI uses. Nothing here assumes a prepared machine: the
# virtualenv and the control-plane binaries are made on first use and cached.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml requirements.lock | sha1sum | cut -c1-12)
# What node-1 is: hollow (the kubelet without containers) or real (the kubelet on containerd,
# the webhook installed by its chart from the locally built image; docs/real-node.md).
NODE ?= hollow

.PHONY: help venv lock audit sbom binaries binaries-current binaries-oldest node vpa tools lint unit e2e test test-oldest cluster cluster-down demo bench compare matrix certs clean image

help:
	@echo "make demo          local control plane + webhook, replays the resize walkthrough"
	@echo "make demo NODE=real  the same on a real node-1 (containerd), the webhook from its"
	@echo "                   image via its Helm chart (docs/real-node.md); CHECKPOINT=1: the"
	@echo "                   victim is checkpointed and comes back (docs/checkpoint.md)"
	@echo "make test          lint, type checks, layering contract, unit and end-to-end tests (on"
	@echo "                   v1.37.2, and the walkthrough, lending and reconciler on $(OLDEST))"
	@echo "make cluster       start the local control plane and leave it running"
	@echo "                   (CLUSTER_ARGS=\"--nodes 2 --cpu 4 --memory 8Gi --grace-cap 1\")"
	@echo "make cluster VPA=1 the same, with the deployment and replicaset controllers and the"
	@echo "                   VPA updater (docs/vpa.md)"
	@echo "make cluster NODE=real  node-1 the kubelet on containerd (node-2..N hollow), the"
	@echo "                   webhook installed by its Helm chart from the locally built image"
	@echo "make cluster-down  stop it"
	@echo "make image         the webhook's image from the Dockerfile, with its OCI labels"
	@echo "                   (IMAGE=REPOSITORY:TAG, default localhost/resize-preemption-webhook:VERSION;"
	@echo "                   CONTAINER_TOOL=docker|podman|buildah; IMAGE_ARCHIVE=FILE an OCI archive too;"
	@echo "                   the base's stand-in from Debian 12 where it cannot be pulled, BASE=stand-in|upstream"
	@echo "                   to choose; PLATFORMS=linux/amd64,linux/arm64 one OCI image index of both,"
	@echo "                   a platform not the machine's built under QEMU; README \"Install on your"
	@echo "                   cluster\", docs/deploy.md \"The image\")"
	@echo "make sbom          the image's SBOM (SPDX JSON, by syft as the release workflow makes it;"
	@echo "                   SBOM=FILE, default dist/resize-preemption-webhook-VERSION.spdx.json)"
	@echo "make certs         a CA, the serving certificate and its Secret manifest in certs/"
	@echo "make node          a real node's stack (kubelet, containerd, runc, CNI plugins; built from"
	@echo "                   the Go module proxy) and its images (pause, busybox, the webhook's own"
	@echo "                   from its Dockerfile), without a registry (docs/real-node.md)"
	@echo "make vpa           the VPA updater and its CRDs (built from the Go module proxy)"
	@echo "make tools         helm, the registry, actionlint and syft (built from the Go module proxy),"
	@echo "                   promtool, prometheus and shellcheck"
	@echo "make bench         benchmarks under bench/"
	@echo "make audit         the pinned dependencies against known advisories: pip-audit, or where"
	@echo "                   PyPI's vulnerability service does not answer, a git clone of"
	@echo "                   pypa/advisory-database in ~/.cache/advisory-database (ADVISORY_DB_FALLBACK)"
	@echo "make audit ADVISORY_DB=DIR  the same offline, against DIR (that clone or another OSV"
	@echo "                   advisory database; docs/reliability.md, \"Dependencies\")"
	@echo "make lock          requirements.lock and requirements-runtime.lock, with hashes"
	@echo "make compare       this webhook vs kube-scheduler v1.37.2 resize preemption (docs/comparison.md)"
	@echo "make matrix        the e2e suite on Kubernetes v1.33-v1.36 and v1.37 with its alpha gate off,"
	@echo "                   and the real node's round on v1.33 (builds each; docs/control-plane.md)"

# Every dependency, pip and setuptools included, at the version and with a hash of
# requirements.lock; the package itself then, built with those (no other download). The lock
# lists every package, so pip resolves nothing (--no-deps): a new release of a package a pin
# asks for with an extra (pip-audit's CacheControl[filecache]) would otherwise make an older
# pip fetch it, unpinned, and refuse. pip check then confirms the pins agree.
$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes --no-deps -r requirements.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -m pip check
	rm -f $(VENV)/.installed-* && touch $@

venv: $(STAMP)

# requirements.lock (everything, the dev tools included) and requirements-runtime.lock (what
# the image installs), pinned with hashes, from pyproject.toml; versions already pinned stay.
LOCK := $(VENV)/bin/pip-compile --quiet --generate-hashes --strip-extras --no-emit-index-url --no-emit-find-links
lock: venv
	$(LOCK) --extra dev --allow-unsafe -o requirements.lock pyproject.toml
	$(LOCK) -o requirements-runtime.lock pyproject.toml

# Known advisories against every pin of both locks (scripts/audit_offline.py); fails on any.
# pip-audit asks PyPI's vulnerability service; where that audits no pin (a mirror without
# it, no network), a checkout of an OSV advisory database at ADVISORY_DB_FALLBACK answers
# instead. ADVISORY_DB=DIR checks against DIR only (docs/reliability.md, "Dependencies").
ADVISORY_DB ?=
ADVISORY_DB_FALLBACK ?= $(HOME)/.cache/advisory-database
audit: venv
	$(PY) scripts/audit_offline.py $(if $(ADVISORY_DB),--db $(ADVISORY_DB),--fallback-db $(ADVISORY_DB_FALLBACK)) requirements.lock requirements-runtime.lock

# The oldest Kubernetes version the product supports: `make test` runs the walkthrough, the
# lending and the reconciler tests on it too (docs/control-plane.md, "Versions").
OLDEST := v1.33.13
OLDEST_TESTS := tests/e2e/test_service.py::test_walkthrough_preempts_the_low_priority_pod_and_the_resize_is_actuated \
	tests/e2e/test_lending.py tests/e2e/test_reconciler.py
# pytest-xdist workers of `make test`, `make e2e` and `make test-oldest`: each runs clusters
# of its own, and one of them every test of the real node (tests/e2e/conftest.py,
# MACHINE_GROUP). TEST_WORKERS=0 runs the tests in this process, one after another.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadgroup
BUILD_OLDEST := RPW_KUBE_VERSION=$(OLDEST) RPW_KUBE_NO_FALLBACK=1 scripts/build-control-plane.sh

# v1.37.2's control plane (what the demo, the cluster and most tests run) and the oldest's,
# each built once and cached.
binaries: binaries-current binaries-oldest

binaries-current:
	@scripts/build-control-plane.sh >/dev/null

binaries-oldest:
	@$(BUILD_OLDEST) >/dev/null

# The webhook's image from the Dockerfile (docker, podman or buildah; IMAGE=... names it), on
# the real node's stand-in base when its own cannot be pulled (BASE=, IMAGE_ARCHIVE=); for
# PLATFORMS=linux/amd64,linux/arm64 one image index, the foreign platform under QEMU
# (the script installs qemu-user-static and registers its binfmt_misc handler when missing).
image:
	@scripts/build-image.sh

# The image's SBOM (SPDX JSON) by syft, built from the Go module proxy, as the release
# workflow makes it (SBOM=FILE, default dist/resize-preemption-webhook-VERSION.spdx.json).
sbom:
	@scripts/sbom.sh

# A real node: kubelet, containerd, runc and the CNI plugins (Go module proxy), CRIU (its
# Debian source package's upstream tarball, for checkpoint and restore), and the images it
# runs as OCI archives (Debian's buildah and mmdebstrap), all cached like the control plane.
node:
	@scripts/build-node.sh >/dev/null
	@scripts/build-criu.sh >/dev/null
	@scripts/build-images.sh >/dev/null

# The Vertical Pod Autoscaler's updater and CRDs (built from the Go module proxy, cached like
# the control plane), for `make cluster VPA=1`, tests/e2e/test_vpa.py and bench/vpa.py.
vpa:
	@scripts/build-vpa.sh >/dev/null

# helm, CNCF Distribution's registry, actionlint and syft (built from the Go module proxy,
# cached like the control plane), promtool, prometheus and shellcheck (Debian's packages),
# for the chart, checkpoint, monitoring, release workflow and SBOM tests.
tools:
	@scripts/build-tools.sh >/dev/null
	@scripts/build-registry.sh >/dev/null
	@scripts/build-actionlint.sh >/dev/null
	@scripts/build-syft.sh >/dev/null
	@scripts/install-test-tools.sh

lint: venv
	$(VENV)/bin/ruff check webhook harness tests bench
	$(VENV)/bin/ruff format --check webhook harness tests bench
	$(VENV)/bin/mypy webhook
	$(VENV)/bin/lint-imports

unit: venv
	$(PY) -m pytest tests/unit -q

e2e: venv binaries-current node vpa tools
	$(PY) -m pytest tests/e2e -q $(XDIST) -m "not solo"
	$(PY) -m pytest tests/e2e -q -p no:cacheprovider -m solo

# The tests marked solo measure what the service takes on this machine, against its
# measured saturation: they run alone, after the others.
test: lint binaries node vpa tools
	$(PY) -m pytest -q --durations=30 $(XDIST) -m "not solo"
	$(PY) -m pytest -q -p no:cacheprovider -m solo
	$(MAKE) --no-print-directory test-oldest

test-oldest: venv binaries-oldest
	RPW_ASSETS=$$($(BUILD_OLDEST)) $(PY) -m pytest -q -p no:cacheprovider $(XDIST) $(OLDEST_TESTS)

cluster: venv binaries-current $(if $(filter 1,$(VPA)),vpa) $(if $(filter real,$(NODE)),node)
	@$(PY) -m harness up --node $(NODE) $(CLUSTER_ARGS) $(if $(filter 1,$(VPA)),--vpa)

cluster-down: venv
	@$(PY) -m harness down

demo: venv binaries-current $(if $(filter real,$(NODE)),node)
	@$(PY) -m harness demo --node $(NODE) $(if $(filter 1,$(CHECKPOINT)),--checkpoint)

bench: venv
	$(PY) -m bench

compare: venv binaries-current
	$(PY) -m bench.compare --repeat 3

# Opt-in, never part of `make test`: builds the control planes of v1.33-v1.36 (a quarter of
# an hour each on two cores, cached like v1.37.2) and runs every hollow-node e2e module on
# each and on v1.37.2 with the scheduler's alpha gate held off (MATRIX_ARGS="--versions
# v1.36.3 --modules test_service.py --docs"; docs/control-plane.md, "Versions").
matrix: venv
	$(PY) -m harness.matrix $(MATRIX_ARGS)

# A private CA and the serving certificate in certs/ (git-ignored), with the Secret manifest
# and the caBundle patch beside them; see certs/README.md.
certs: venv
	$(PY) -m webhook certs --kustomize-patch --secret-yaml > certs/secret.yaml.tmp
	mv certs/secret.yaml.tmp certs/secret.yaml
	@echo "certs/: ca.crt tls.crt tls.key ca-bundle.yaml secret.yaml"

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
