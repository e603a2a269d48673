#!/usr/bin/env bash
# Installs the test tools that come from the distribution rather than the Go module proxy:
# promtool and the Prometheus server, both in Debian's `prometheus` package (the rules'
# unit tests and tests/e2e/test_prometheus.py run them), and shellcheck, which actionlint
# runs on each `run:` script of the release workflow. Does nothing when all three are there.
set -euo pipefail

log() { printf '[install-test-tools] %s\n' "$*" >&2; }

packages=()
command -v promtool >/dev/null && command -v prometheus >/dev/null || packages+=(prometheus)
command -v shellcheck >/dev/null || packages+=(shellcheck)
((${#packages[@]})) || exit 0
if ! command -v apt-get >/dev/null; then
  log "${packages[*]} missing and no apt-get: install Prometheus >= 2.37 and shellcheck by hand"
  exit 1
fi
sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"
log "installing Debian's ${packages[*]}"
$sudo apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${packages[@]}" >&2
# The prometheus package starts a server on :9090 where systemd runs; the tests start their own.
if [[ " ${packages[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null; then
  $sudo systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
