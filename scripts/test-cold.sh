#!/usr/bin/env bash
# `make test` as a fresh machine sees it: a clone of HEAD (committed work only, as CI gets it) in a new folder, with
# every cache the suite or its installs create pointed at new empty folders, so that no leftover of an earlier run
# (a pip target folder, a prompt pool, SGLang's venv, ~/.ansible, /tmp files) can make it pass. Debian packages
# are the exception: they stay installed (scripts/install-system-deps.sh installs them on a machine without).
# Usage: scripts/test-cold.sh [DIR]   (default: a new folder under /var/tmp; kept afterwards for its logs)
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
root="${1:-$(mktemp -d /var/tmp/servesweep-cold.XXXXXX)}"
mkdir -p "$root"/{home,tmp,cache,xdg,pip}
git clone -q "$src" "$root/clone"
cd "$root/clone"
echo "cold run of $(git rev-parse --short HEAD) in $root" >&2
start=$(date +%s)
set +e
env -u VIRTUAL_ENV HOME="$root/home" TMPDIR="$root/tmp" XDG_CACHE_HOME="$root/xdg" PIP_CACHE_DIR="$root/pip" \
  SERVESWEEP_CACHE_DIR="$root/cache" CI=true make test 2>&1 | tee "$root/test.log"
rc=${PIPESTATUS[0]}
set -e
echo "cold make test: exit $rc in $(( $(date +%s) - start )) s (log: $root/test.log)" >&2
exit "$rc"
