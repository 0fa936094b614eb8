#!/usr/bin/env bash
# The one way the test suites install system packages.
#
#   test/apt-install.sh PACKAGE...
#
# Installs the named Debian packages that are not installed yet, and does
# nothing (not even `apt-get update`) when all are. `go test ./...` runs
# test binaries in parallel, and apt and dpkg take exclusive locks and fail
# at once when another apt holds them, so every caller serializes on one
# machine-wide lock file first ($PLEG_APT_LOCK, default
# /var/lock/pleg-apt-install.lock), and apt itself is told to wait for its
# own locks as well, in case something outside this project (unattended
# upgrades, a person) holds them.
#
# Services the packages ship are not started (policy-rc.d). Must run as
# root on a machine with apt-get. Prints what it does on
# stderr, prefixed "apt-install:"; exits non-zero with a line starting
# "apt-install: FAILED" when a package cannot be installed.
set -euo pipefail

say() { echo "apt-install: $*" >&2; }
fail() {
	echo "apt-install: FAILED: $*" >&2
	exit 1
}

(($# > 0)) || fail "usage: $0 PACKAGE..."
command -v dpkg-query >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 ||
	fail "no apt-get/dpkg here: install $* with this system's package manager"

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q ' installed$'; }

missing() {
	local p out=()
	for p in "$@"; do
		installed "$p" || out+=("$p")
	done
	echo "${out[*]}"
}

want=$(missing "$@")
[[ -z $want ]] && exit 0
[[ $(id -u) == 0 ]] || fail "$want not installed and this is not root (uid $(id -u)): run apt-get install -y $want as root"

lock=${PLEG_APT_LOCK:-/var/lock/pleg-apt-install.lock}
mkdir -p "$(dirname "$lock")"
exec 7>"$lock"
if command -v flock >/dev/null 2>&1; then
	start=$(date +%s)
	flock -w 1200 7 || fail "waited 20 minutes for $lock (another install running?)"
	waited=$(($(date +%s) - start))
	((waited > 1)) && say "waited ${waited}s for another install to finish"
else
	fail "flock (util-linux) is missing: cannot serialize apt-get"
fi

# Another caller may have installed them while we waited.
want=$(missing "$@")
[[ -z $want ]] && exit 0

export DEBIAN_FRONTEND=noninteractive
apt_opts=(-q -o DPkg::Lock::Timeout=600 -o Acquire::Retries=3)

# A dpkg run killed earlier leaves "dpkg was interrupted": finish it first.
dpkg --configure -a >/dev/null 2>&1 || true

start=$(date +%s)
say "installing $want"
# `apt-get update` once per machine-wide lock holder: skipped when the
# lists were refreshed in the last hour and know every wanted package.
stamp=/var/lib/apt/periodic/pleg-apt-install-update
need_update=1
if [[ -f $stamp ]] && (($(date +%s) - $(stat -c %Y "$stamp") < 3600)); then
	need_update=0
	for p in $want; do
		apt-cache show "$p" >/dev/null 2>&1 || need_update=1
	done
fi
if ((need_update)); then
	ok=0
	for try in 1 2 3; do
		if apt-get "${apt_opts[@]}" update >&2; then
			ok=1
			break
		fi
		say "apt-get update failed (try $try of 3)"
		sleep $((try * 5))
	done
	((ok)) || fail "apt-get update failed three times"
	mkdir -p "$(dirname "$stamp")" && touch "$stamp"
fi
# Packages installed for tests never start services (prometheus, containerd
# ship init scripts): Debian's policy-rc.d says no while we install.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [[ ! -e $policy ]]; then
	printf '#!/bin/sh\n# written by pleg test/apt-install.sh while it installs\nexit 101\n' >"$policy"
	chmod 755 "$policy"
	made_policy=1
	trap 'rm -f "$policy"' EXIT
fi
# shellcheck disable=SC2086 # $want is a list of package names
apt-get "${apt_opts[@]}" install -y --no-install-recommends $want >&2 ||
	fail "apt-get install $want failed"
if ((made_policy)); then
	rm -f "$policy"
	trap - EXIT
fi
left=$(missing "$@")
[[ -z $left ]] || fail "still not installed after apt-get install: $left"
say "installed $want in $(($(date +%s) - start))s"
