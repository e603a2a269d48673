#!/usr/bin/env bash
# Installs the test tools that come from the distribution rather than the Go module proxy:
# promtool and the Prometheus server, both in Debian's `prometheus` package (the rules'
# unit tests and tests/e2e/test_prometheus.py run them). Does nothing when both are there.
set -euo pipefail

log() { printf '[install-test-tools] %s\n' "$*" >&2; }

if command -v promtool >/dev/null && command -v prometheus >/dev/null; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  log "promtool/prometheus missing and no apt-get: install Prometheus >= 2.37 by hand"
  exit 1
fi
sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"
log "installing Debian's prometheus package (promtool, prometheus)"
$sudo apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >&2
# The package starts a server on :9090 where systemd runs; the tests start their own.
command -v systemctl >/dev/null && $sudo systemctl disable --now prometheus >/dev/null 2>&1 || true
