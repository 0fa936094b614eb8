#!/usr/bin/env bash
# Provision everything the e2e suite (test/e2e) needs on a fresh Debian
# machine. Idempotent; the e2e TestMain runs it on every start, and when all
# is in place it only rebuilds the (cached, tiny) test images.
#
#   1. runc, from Debian, if not installed (through test/apt-install.sh,
#      which serializes with the other suites' installs).
#   1b. busybox, from Debian's busybox-static, if /bin/busybox is missing:
#      the base of the pleg image the DaemonSet test builds from
#      deploy/Dockerfile (plegimage.go).
#   2. containerd, containerd-shim-runc-v2 and ctr for each version in
#      $PLEG_E2E_RUNTIMES (default: 1.6.20 1.7.35 2.2.9 2.3.7 2.4.2 crio-1.36.3) in
#      $PLEG_E2E_CACHE/containerd-<version>/bin (default cache
#      <repo>/.cache/e2e), unless that version is already there: 2.x with
#      go install, 1.7.x built from its module source, 1.6.x Debian's package.
#   2b. CRI-O (crio-1.36.3 in $PLEG_E2E_RUNTIMES): crio and pinns built from
#      the module source into $PLEG_E2E_CACHE/crio-<version>/bin, and Debian's
#      conmon, containernetworking-plugins and skopeo.
#   3. The test images: the static workload binary and an OCI image-layout
#      archive with docker.io/pleg/pause:e2e and docker.io/pleg/workload:e2e,
#      at $PLEG_E2E_CACHE/images/e2e-images.tar, and one archive per image
#      (pause.tar, workload.tar) for CRI-O's skopeo import.
#
# Environment: GO (go command to use, default: go on PATH, else
# /usr/local/go/bin/go), PLEG_E2E_CACHE (cache dir).
# Exits non-zero with a message starting "provision: FAILED" when something
# cannot be provisioned.
set -euo pipefail

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

# --- 1b. busybox: the pleg image's base -------------------------------------
if [[ ! -x /bin/busybox ]]; then
	say "/bin/busybox not found; installing Debian's busybox-static"
	bash "$repo_root/test/apt-install.sh" busybox-static || fail "installing busybox-static failed"
	[[ -x /bin/busybox ]] || fail "/bin/busybox still not found after installing Debian's busybox-static"
fi
say "busybox: $(/bin/busybox 2>&1 | head -n1 || true)"

# --- 2. containerd, one build per version ------------------------------------
# $PLEG_E2E_RUNTIMES: space- or comma-separated versions to provision
# (default: all of $ALL_RUNTIMES). Each lands in $cache/containerd-<version>/bin
# (containerd, containerd-shim-runc-v2, ctr), checked by version:
#   2.x     go install ...@vX (its go.mod allows it)
#   1.7.x   built from the module source (go install refuses it: its go.mod
#           has exclude directives): go mod download, copy, go build
#   1.6.20  Debian's containerd package (through test/apt-install.sh),
#           symlinked into the per-version dir; never started as a service
ALL_RUNTIMES="1.6.20 1.7.35 2.2.9 2.3.7 2.4.2 crio-1.36.3"
runtimes=${PLEG_E2E_RUNTIMES:-$ALL_RUNTIMES}
runtimes=${runtimes//,/ }

have_containerd() { # dir version
	local d=$1 want=$2 b
	for b in containerd containerd-shim-runc-v2 ctr; do
		[[ -x $d/$b ]] || return 1
	done
	# Outputs are captured first: grep -q exits at the first match, and a
	# writer killed by SIGPIPE would fail the pipeline (pipefail).
	local out
	out=$("$d/containerd" --version 2>/dev/null) || true
	grep -q "[ v]$want\b" <<<"$out" || return 1
	out=$("$d/ctr" --version 2>/dev/null) || true
	grep -q "[ v]$want\b" <<<"$out" || return 1
	out=$("$d/containerd-shim-runc-v2" -v 2>/dev/null) || true
	grep -q "Version: *v\?$want\b" <<<"$out" || return 1
}

build_containerd() { # version dir
	local v=$1 d=$2 start
	start=$(date +%s)
	rm -rf "$d" && mkdir -p "$d"
	case $v in
	2.*)
		say "building containerd v$v into $d with go install (takes 1-3 minutes)"
		# Build outside the repository so its go.mod/go.work play no part.
		(
			cd "$cache"
			GOBIN=$d CGO_ENABLED=0 GOFLAGS= GOWORK=off "$gocmd" install -tags "$CONTAINERD_TAGS" \
				"github.com/containerd/containerd/v2/cmd/containerd@v$v" \
				"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@v$v" \
				"github.com/containerd/containerd/v2/cmd/ctr@v$v"
		) || fail "building containerd v$v failed (needs the Go module proxy)"
		;;
	1.7.*)
		say "building containerd v$v into $d from its module source (takes 1-3 minutes)"
		local src mod
		src=$(cd "$cache" && GOFLAGS= GOWORK=off "$gocmd" mod download -json "github.com/containerd/containerd@v$v" |
			sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p') || true
		[[ -n $src && -d $src ]] || fail "go mod download github.com/containerd/containerd@v$v failed (needs the Go module proxy)"
		mod=$cache/src/containerd-$v
		rm -rf "$mod" && mkdir -p "$cache/src" && cp -r "$src" "$mod" && chmod -R u+w "$mod" ||
			fail "copying the containerd v$v source to $mod failed"
		(
			cd "$mod"
			CGO_ENABLED=0 GOFLAGS=-mod=mod GOWORK=off "$gocmd" build -tags "$CONTAINERD_TAGS" \
				-ldflags "-X github.com/containerd/containerd/version.Version=v$v" \
				-o "$d/" ./cmd/containerd ./cmd/containerd-shim-runc-v2 ./cmd/ctr
		) || fail "building containerd v$v from $mod failed"
		rm -rf "$mod"
		;;
	1.6.*)
		say "installing Debian's containerd (expected $v) for $d"
		bash "$repo_root/test/apt-install.sh" containerd || fail "installing Debian's containerd failed"
		local b
		for b in containerd containerd-shim-runc-v2 ctr; do
			[[ -x /usr/bin/$b ]] || fail "Debian's containerd package has no /usr/bin/$b"
			ln -sf "/usr/bin/$b" "$d/$b"
		done
		;;
	*) fail "unknown containerd version $v (known: $ALL_RUNTIMES)" ;;
	esac
	have_containerd "$d" "$v" || fail "containerd binaries in $d do not report version $v ($("$d/containerd" --version 2>&1 | head -n1))"
	say "provisioned containerd v$v in $(($(date +%s) - start))s"
}

# CRI-O (crio-<version> in $PLEG_E2E_RUNTIMES): crio and pinns in
# $cache/crio-<version>/bin, built from the module source (the proxy serves
# exact versions only): go mod download, copy, chmod u+w, then
#   crio   CGO_ENABLED=0 go build with the tags CRI-O's Makefile computes
#          here minus seccomp (which needs cgo and libseccomp-dev); 2-5 min
#   pinns  make -C pinns (C, static; gcc), a few seconds
# and Debian's conmon, containernetworking-plugins (the loopback plugin) and
# skopeo (loads the test images into CRI-O's storage), through
# test/apt-install.sh. runc is the runtime (Debian's crun 1.8 refuses the
# runtime-spec CRI-O 1.36 writes).
CRIO_TAGS="containers_image_ostree_stub exclude_graphdriver_btrfs btrfs_noversion containers_image_openpgp"

have_crio() { # dir version
	local d=$1 want=$2 out
	[[ -x $d/crio && -x $d/pinns ]] || return 1
	out=$("$d/crio" --version 2>/dev/null) || true
	grep -q "^crio version $want\b" <<<"$out" || return 1
}

build_crio() { # version dir
	local v=$1 d=$2 start src mod
	start=$(date +%s)
	say "building CRI-O v$v into $d from its module source (takes 2-5 minutes)"
	rm -rf "$d" && mkdir -p "$d"
	src=$(cd "$cache" && GOFLAGS= GOWORK=off "$gocmd" mod download -json "github.com/cri-o/cri-o@v$v" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p') || true
	[[ -n $src && -d $src ]] || fail "go mod download github.com/cri-o/cri-o@v$v failed (needs the Go module proxy)"
	mod=$cache/src/crio-$v
	rm -rf "$mod" && mkdir -p "$cache/src" && cp -r "$src" "$mod" && chmod -R u+w "$mod" ||
		fail "copying the CRI-O v$v source to $mod failed"
	(
		cd "$mod"
		CGO_ENABLED=0 GOFLAGS=-mod=mod GOWORK=off "$gocmd" build -trimpath -tags "$CRIO_TAGS" -o "$d/crio" ./cmd/crio
	) || fail "building crio v$v from $mod failed"
	make -C "$mod/pinns" >/dev/null || fail "building pinns (make -C $mod/pinns) failed (needs gcc)"
	cp "$mod/bin/pinns" "$d/pinns" || fail "pinns not found at $mod/bin/pinns after make"
	rm -rf "$mod"
	have_crio "$d" "$v" || fail "crio in $d does not report version $v ($("$d/crio" --version 2>&1 | head -n1))"
	say "provisioned CRI-O v$v in $(($(date +%s) - start))s"
}

for v in $runtimes; do
	v=${v#v}
	case $v in
	crio-*)
		v=${v#crio-}
		v=${v#v}
		missing=()
		command -v conmon >/dev/null 2>&1 || missing+=(conmon)
		command -v skopeo >/dev/null 2>&1 || missing+=(skopeo)
		[[ -x /usr/lib/cni/loopback ]] || missing+=(containernetworking-plugins)
		if ((${#missing[@]} > 0)); then
			say "installing Debian's ${missing[*]} for CRI-O"
			bash "$repo_root/test/apt-install.sh" "${missing[@]}" || fail "installing ${missing[*]} failed"
		fi
		command -v conmon >/dev/null 2>&1 && command -v skopeo >/dev/null 2>&1 && [[ -x /usr/lib/cni/loopback ]] ||
			fail "conmon, skopeo or /usr/lib/cni/loopback still missing after installing Debian's packages"
		say "conmon: $(command -v conmon) ($(conmon --version 2>&1 | head -n1)); skopeo: $(skopeo --version 2>&1)"
		d=$cache/crio-$v/bin
		if have_crio "$d" "$v"; then
			say "CRI-O v$v: present in $d"
		else
			build_crio "$v" "$d"
		fi
		;;
	*)
		d=$cache/containerd-$v/bin
		if have_containerd "$d" "$v"; then
			say "containerd v$v: present in $d"
		else
			build_containerd "$v" "$d"
		fi
		;;
	esac
done

# --- 3. test images ----------------------------------------------------------
(
	cd "$repo_root"
	CGO_ENABLED=0 GOFLAGS= "$gocmd" build -trimpath -ldflags="-s -w" -o "$images/workload" ./test/e2e/images/workload
	GOFLAGS= "$gocmd" build -o "$bin/mkimage" ./test/e2e/images/mkimage
) || fail "building the test image programs failed"
"$bin/mkimage" -binary "$images/workload" -path /workload -out "$images/e2e-images.tar" \
	-image "docker.io/pleg/pause:e2e=pause" \
	-image "docker.io/pleg/workload:e2e=run" || fail "writing the test image archive failed"
# skopeo cannot pick one of two images both tagged "e2e" out of one
# archive: CRI-O's env loads one archive per image.
"$bin/mkimage" -binary "$images/workload" -path /workload -out "$images/pause.tar" \
	-image "docker.io/pleg/pause:e2e=pause" || fail "writing the pause image archive failed"
"$bin/mkimage" -binary "$images/workload" -path /workload -out "$images/workload.tar" \
	-image "docker.io/pleg/workload:e2e=run" || fail "writing the workload image archive failed"
say "images: $images/e2e-images.tar (docker.io/pleg/pause:e2e, docker.io/pleg/workload:e2e), pause.tar, workload.tar"
say "done"
