#!/usr/bin/env bash
# Provision everything the e2e suite (test/e2e) needs on a fresh Debian
# machine. Idempotent; the e2e TestMain runs it on every start, and when all
# is in place it only rebuilds the (cached, tiny) test images.
#
#   1. runc, from Debian, if not installed (through test/apt-install.sh,
#      which serializes with the other suites' installs).
#   2. containerd, containerd-shim-runc-v2 and ctr at $CONTAINERD_VERSION, built
#      from source with the Go toolchain into $PLEG_E2E_CACHE/bin (default
#      <repo>/.cache/e2e/bin), unless that version is already there.
#   3. The test images: the static workload binary and an OCI image-layout
#      archive with docker.io/pleg/pause:e2e and docker.io/pleg/workload:e2e,
#      at $PLEG_E2E_CACHE/images/e2e-images.tar.
#
# Environment: GO (go command to use, default: go on PATH, else
# /usr/local/go/bin/go), PLEG_E2E_CACHE (cache dir).
# Exits non-zero with a message starting "provision: FAILED" when something
# cannot be provisioned.
set -euo pipefail

CONTAINERD_VERSION=v2.2.9
CONTAINERD_TAGS="no_btrfs no_zfs no_devmapper no_aufs"

say() { echo "provision: $*"; }
fail() {
	echo "provision: FAILED: $*" >&2
	exit 1
}

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd "$script_dir/../.." && pwd)
[[ -f $repo_root/go.mod ]] || fail "cannot find the repository root (no go.mod in $repo_root)"
cache=${PLEG_E2E_CACHE:-$repo_root/.cache/e2e}
bin=$cache/bin
images=$cache/images
mkdir -p "$bin" "$images"

# One provisioning at a time per cache dir.
if command -v flock >/dev/null 2>&1; then
	exec 9>"$cache/provision.lock"
	flock 9
fi

[[ $(id -u) == 0 ]] || fail "must run as root (containerd and runc need it); running as uid $(id -u)"

gocmd=${GO:-}
if [[ -z $gocmd ]]; then
	if command -v go >/dev/null 2>&1; then
		gocmd=$(command -v go)
	elif [[ -x /usr/local/go/bin/go ]]; then
		gocmd=/usr/local/go/bin/go
	else
		fail "no Go toolchain found (set GO=/path/to/go)"
	fi
fi

# --- 1. runc -----------------------------------------------------------------
find_runc() {
	command -v runc 2>/dev/null || { [[ -x /usr/sbin/runc ]] && echo /usr/sbin/runc; } || true
}
runc_path=$(find_runc)
if [[ -z $runc_path ]]; then
	say "runc not found; installing Debian's package"
	# The one entry point for system packages: it serializes with every
	# other suite's installs (go test runs test binaries in parallel).
	bash "$repo_root/test/apt-install.sh" runc || fail "installing runc failed"
	runc_path=$(find_runc)
	[[ -n $runc_path ]] || fail "runc still not found after installing Debian's package runc"
fi
say "runc: $runc_path ($("$runc_path" --version | head -n1))"

# --- 2. containerd -----------------------------------------------------------
want=${CONTAINERD_VERSION#v}
have_containerd() {
	local b
	for b in containerd containerd-shim-runc-v2 ctr; do
		[[ -x $bin/$b ]] || return 1
	done
	"$bin/containerd" --version 2>/dev/null | grep -q " $want\b" || return 1
	"$bin/ctr" --version 2>/dev/null | grep -q " $want\b" || return 1
	"$bin/containerd-shim-runc-v2" -v 2>/dev/null | grep -q "Version: *$want\b" || return 1
}
if have_containerd; then
	say "containerd $CONTAINERD_VERSION: present in $bin"
else
	say "building containerd $CONTAINERD_VERSION into $bin (takes 1-3 minutes)"
	start=$(date +%s)
	# Build outside the repository so its go.mod/go.work play no part.
	(
		cd "$cache"
		GOBIN=$bin CGO_ENABLED=0 GOFLAGS= GOWORK=off "$gocmd" install -tags "$CONTAINERD_TAGS" \
			"github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
			"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
			"github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION"
	) || fail "building containerd $CONTAINERD_VERSION failed (needs the Go module proxy)"
	have_containerd || fail "containerd binaries in $bin do not report version $want after the build"
	say "built containerd $CONTAINERD_VERSION in $(($(date +%s) - start))s"
fi

# --- 3. test images ----------------------------------------------------------
(
	cd "$repo_root"
	CGO_ENABLED=0 GOFLAGS= "$gocmd" build -trimpath -ldflags="-s -w" -o "$images/workload" ./test/e2e/images/workload
	GOFLAGS= "$gocmd" build -o "$bin/mkimage" ./test/e2e/images/mkimage
) || fail "building the test image programs failed"
"$bin/mkimage" -binary "$images/workload" -path /workload -out "$images/e2e-images.tar" \
	-image "docker.io/pleg/pause:e2e=pause" \
	-image "docker.io/pleg/workload:e2e=run" || fail "writing the test image archive failed"
say "images: $images/e2e-images.tar (docker.io/pleg/pause:e2e, docker.io/pleg/workload:e2e)"
say "done"
