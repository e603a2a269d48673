# Container image of resize-preemption-webhook.
#
#   make image            (scripts/build-image.sh: the labels below filled in)
#   docker build -t localhost/resize-preemption-webhook:0.1.0 .
#
# Two stages: the first installs the pinned runtime dependencies (requirements.lock) and the
# package into a virtualenv, the second copies only that virtualenv onto a clean base.
# For reproducible builds pin the base by digest too (python:3.11-slim-bookworm@sha256:...).

FROM python:3.11-slim-bookworm AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src

# Dependencies first (a layer that changes only with the lock): the runtime requirements
# of pyproject.toml and theirs, each at the version and with a hash requirements-runtime.lock
# pins (`make lock`); pip refuses a file whose hash differs, and resolves nothing beyond the
# lock, which lists every package (`pip check` below confirms they agree). Development tools
# (the "dev" extra) are never installed.
COPY requirements-runtime.lock ./
RUN pip install --no-cache-dir --require-virtualenv --require-hashes --no-deps \
      -r requirements-runtime.lock

# Then the package itself, without touching the dependencies installed above.
COPY pyproject.toml README.md ./
COPY webhook ./webhook
# The virtualenv's own pip and setuptools (ensurepip's, pinned by nothing) only build it: the
# image carries no Python package the lock does not pin (tests/e2e/test_sbom.py).
RUN pip install --no-cache-dir --require-virtualenv --no-deps . \
 && pip check \
 && python -m pip uninstall --yes --quiet pip setuptools


FROM python:3.11-slim-bookworm

LABEL org.opencontainers.image.title="resize-preemption-webhook" \
      org.opencontainers.image.description="Makes room for in-place pod resizes by preempting lower-priority pods on the same node" \
      org.opencontainers.image.licenses="Apache-2.0"

# A fixed numeric user (runAsNonRoot can only verify a numeric USER).
RUN groupadd --gid 65532 rpw \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin rpw

COPY --from=build /opt/venv /opt/venv

# The root filesystem is read-only in the Deployment: no bytecode writes, unbuffered logs,
# temporary files under the /tmp emptyDir.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp

USER 65532:65532
WORKDIR /tmp

# 8443: HTTPS admission reviews, /livez, /readyz. 9090: plain-HTTP /metrics.
EXPOSE 8443 9090

# Last, so that a new commit changes only the image's configuration, no layer.
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=
LABEL org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION" \
      org.opencontainers.image.source="$SOURCE"

# `serve` runs the gunicorn server, two worker processes for the two cores the Deployment
# gives it (docs/service.md "Processes"); deploy/base/deployment.yaml spells out the same command.
ENTRYPOINT ["python", "-m", "webhook"]
CMD ["serve", "--tls-cert", "/etc/rpw/tls/tls.crt", "--tls-key", "/etc/rpw/tls/tls.key", "--port", "8443", "--metrics-port", "9090", "--workers", "2"]
