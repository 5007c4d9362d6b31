#!/usr/bin/env bash
# Installs the Debian packages the test suite drives for real. Idempotent: does nothing when all are present.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
need=()
# command -> Debian package
declare -A pkgs=(
  [ip]=iproute2
  [prometheus]=prometheus
  [promtool]=prometheus
  [prometheus-pushgateway]=prometheus-pushgateway
  [chromium]=chromium
  [sshd]=openssh-server
  [ssh]=openssh-client
  [openssl]=openssl
)
for cmd in "${!pkgs[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || need+=("${pkgs[$cmd]}")
done
# one package may provide several commands
mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u | sed '/^$/d')
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "missing Debian packages: ${need[*]} (run as root: apt-get install ${need[*]})" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}"
