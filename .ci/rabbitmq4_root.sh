#!/usr/bin/env bash
# A Debian 13 (trixie) root with its rabbitmq-server (4.0.5, Erlang 27), for the suite's
# RabbitMQ 4.0 node (tests/rabbitmq4.py). Built once, as root, with debootstrap and Debian's
# packages only; kept outside the clone (ROOT, default /var/cache/redrive-test/trixie-rabbitmq)
# and reused by every later run. No Debian suite has RabbitMQ 4.1 or later.
#
# The host is left as it was: the build happens in ROOT.partial and is renamed into place only
# once complete; /proc (and whatever debootstrap mounted) is unmounted on every exit; nothing
# of the host is bind-mounted. A root that cannot be built is said in one line on stderr and
# in ROOT.failed (the tests skip with it locally; under CI=true this fails, as the tests do).
set -euo pipefail

ROOT="${1:?usage: rabbitmq4_root.sh ROOT}"
ROOT="${ROOT%/}"
PARTIAL="$ROOT.partial"
READY="$ROOT/.redrive-root"
MIRROR="${REDRIVE_TRIXIE_MIRROR:-http://deb.debian.org/debian}"

[ -f "$READY" ] && exit 0

fail() {
    echo "the RabbitMQ 4.0 root could not be built ($1): the RabbitMQ 4.0 tests will skip" >&2
    mkdir -p "$(dirname "$ROOT")" 2>/dev/null && echo "$1" > "$ROOT.failed" 2>/dev/null || true
    [ "${CI:-}" != true ] || exit 1
    exit 0
}

# Every mount under a folder, deepest first (debootstrap mounts /proc and /sys in the target
# during its second stage and may leave them mounted when it fails).
unmount_under() {
    local dir mounts
    dir="$(realpath -m "$1")"
    mounts="$(awk -v d="$dir/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r)"
    for m in $mounts; do
        umount "$m" 2>/dev/null || umount -l "$m" || true
    done
}

[ "$(id -u)" = 0 ] || fail "not root: debootstrap and chroot need root"
if ! command -v debootstrap >/dev/null 2>&1; then
    echo 'installing debootstrap for the RabbitMQ 4.0 root'
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1 ||
      { apt-get update -qq >/dev/null 2>&1 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1; }; } ||
        fail "debootstrap could not be installed"
fi

# Only a folder this script made is ever removed: a ROOT that exists without its mark is
# someone else's (a wrong path given), and is left alone.
[ ! -e "$ROOT" ] || fail "$ROOT exists but is not a root built here (no $READY)"
[ ! -e "$PARTIAL" ] || [ -f "$PARTIAL/.redrive-building" ] ||
    fail "$PARTIAL exists but is not a build of this script's"
mkdir -p "$(dirname "$ROOT")"
rm -f "$ROOT.failed"
trap 'unmount_under "$PARTIAL"' EXIT
unmount_under "$PARTIAL"
# --one-file-system: never into a mount left behind, whatever happened before.
rm -rf --one-file-system "$PARTIAL"
mkdir "$PARTIAL"
touch "$PARTIAL/.redrive-building"

start=$(date +%s)
echo "building the RabbitMQ 4.0 root in $ROOT (debootstrap trixie; ~1.5 min and ~500 MB, once)"
debootstrap --variant=minbase trixie "$PARTIAL" "$MIRROR" > "$PARTIAL.log" 2>&1 ||
    fail "debootstrap trixie failed: $(tail -n 1 "$PARTIAL.log")"
# No service may start while packages install (Debian's policy-rc.d convention).
printf '#!/bin/sh\nexit 101\n' > "$PARTIAL/usr/sbin/policy-rc.d"
chmod 755 "$PARTIAL/usr/sbin/policy-rc.d"
mountpoint -q "$PARTIAL/proc" || mount -t proc proc "$PARTIAL/proc"
chroot "$PARTIAL" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    DEBIAN_FRONTEND=noninteractive bash -c \
    'apt-get update -qq && apt-get install -y -qq --no-install-recommends rabbitmq-server && apt-get clean' \
    >> "$PARTIAL.log" 2>&1 ||
    fail "apt-get install rabbitmq-server in the trixie root failed: $(tail -n 1 "$PARTIAL.log")"
unmount_under "$PARTIAL"
[ -x "$PARTIAL/usr/lib/rabbitmq/bin/rabbitmq-server" ] ||
    fail "rabbitmq-server is missing from the trixie root after its install"
version="$(chroot "$PARTIAL" dpkg-query -W -f '${Version}' rabbitmq-server)"
seconds=$(( $(date +%s) - start ))
printf 'rabbitmq-server %s\nbuilt in %s s on %s\n' "$version" "$seconds" \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$PARTIAL/.redrive-root"
rm -f "$PARTIAL/.redrive-building"
mv "$PARTIAL" "$ROOT"
mv "$PARTIAL.log" "$ROOT.log"
echo "RabbitMQ 4.0 root ready: rabbitmq-server $version, built in $seconds s"
