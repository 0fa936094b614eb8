#!/usr/bin/env bash
# build.sh OUTDIR [cluster]
#
# build.sh OUTDIR: build the real kubelet v1.37.2 and this module's programs
# (./cmd/*) into OUTDIR, once: the binaries are kept until this module's
# go.mod, go.sum or Go sources (or this script) change.
#
# build.sh OUTDIR cluster: the same (same lock, same key), and THEN the
# control plane into the same OUTDIR: kube-apiserver,
# kube-controller-manager, kube-scheduler and kubectl v1.37.2 from this
# module (one go build: they share most packages, and the kubelet's are
# already in the Go build cache), and etcd from the separate module ./etcd
# (go.etcd.io/etcd/server/v3 needs newer grpc, otel and etcd client modules
# than k8s.io/kubernetes v1.37.2, so it cannot share this module's
# versions), and Prometheus from the separate module ./prometheus (for the
# same reason; Debian's prometheus lacks Kubernetes service discovery),
# with only its Kubernetes (and the always-present static, file and http)
# service discovery compiled in and without the web UI's assets (the HTTP
# API works without them). Kept until go.mod, go.sum, etcd/go.mod,
# etcd/go.sum, prometheus/go.mod, prometheus/go.sum or this script change
# (key file OUTDIR/.cluster-key).
#
# Every suite that needs the kubelet (test/e2e, internal/app/bench) calls this
# script; suites that run at once (go test runs test binaries in parallel)
# build once and never see half-written binaries:
#   - OUTDIR/.build.lock guards the kubelet step (the kubelet, ./cmd/*,
#     OUTDIR/.key). Both modes take it, exactly as before, and hold it only
#     for that step.
#   - OUTDIR/.cluster.lock guards the control-plane step (its six binaries,
#     OUTDIR/.cluster-key). Only cluster mode takes it, after releasing
#     .build.lock: no one ever holds both locks, so there is no lock-order
#     deadlock, and a plain caller never waits for a control-plane build
#     (only, as before, for a kubelet build in progress).
#   - Every binary is built into a temporary dir in OUTDIR and renamed into
#     place, and a key file is written only after all of its step's
#     binaries are in place (and removed before a rebuild starts).
# A plain caller may rebuild the kubelet while a cluster caller builds the
# control plane: the two steps write different files, and the Go build
# cache is safe for concurrent use.
#
# Environment: GO (go command, default: go on PATH, else /usr/local/go/bin/go).
# Exits non-zero with a message starting "kubelet build: FAILED".
set -euo pipefail

fail() {
	echo "kubelet build: FAILED: $*" >&2
	exit 1
}

if [[ $# == 1 ]]; then
	cluster=0
elif [[ $# == 2 && $2 == cluster ]]; then
	cluster=1
else
	fail "usage: build.sh OUTDIR [cluster]"
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=$1
mkdir -p "$out"
out=$(cd "$out" && pwd)

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
command -v flock >/dev/null 2>&1 || fail "flock is missing (util-linux)"

tmps=()
trap 'rm -rf "${tmps[@]}"' EXIT

version=v1.37.2
ldflags="-X k8s.io/component-base/version.gitVersion=$version"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$version"

# fresh KEYFILE KEY BINARY...: the key file holds KEY and every binary is
# there and executable.
fresh() {
	local keyfile=$1 key=$2 b
	shift 2
	[[ -f $keyfile && $(cat "$keyfile") == "$key" ]] || return 1
	for b in "$@"; do
		[[ -x $b ]] || return 1
	done
}

# install TMP BINARY...: move each binary's build from TMP into place.
install_bins() {
	local tmp=$1 b
	shift
	for b in "$@"; do
		[[ -x $tmp/$(basename "$b") ]] || fail "go build made no $(basename "$b")"
		mv -f "$tmp/$(basename "$b")" "$b"
	done
}

# The kubelet step, under .build.lock (fd 9).
exec 9>"$out/.build.lock"
flock 9

cd "$here"
# ./etcd and ./prometheus are modules of their own, for the control-plane
# step only.
mapfile -t sources < <(find . \( -path ./etcd -o -path ./prometheus \) -prune -o \( -name '*.go' -o -name go.mod -o -name go.sum -o -name build.sh \) -print | LC_ALL=C sort)
key=$(cat "${sources[@]}" | sha256sum | cut -c1-16)
mapfile -t programs < <(find ./cmd -mindepth 1 -maxdepth 1 -type d 2>/dev/null | LC_ALL=C sort)
want=("$out/kubelet")
for p in "${programs[@]}"; do
	want+=("$out/$(basename "$p")")
done
if ! fresh "$out/.key" "$key" "${want[@]}"; then
	echo "kubelet build: building the kubelet $version${programs:+ and ${programs[*]#./cmd/}} into $out (minutes on a cold Go cache)"
	start=$SECONDS
	rm -f "$out/.key"
	tmp=$(mktemp -d "$out/.build.XXXXXX")
	tmps+=("$tmp")
	# Static binaries, as the kubelet's own release builds are.
	if ! CGO_ENABLED=0 "$gocmd" build -trimpath -ldflags "$ldflags" -o "$tmp/" k8s.io/kubernetes/cmd/kubelet "${programs[@]}"; then
		fail "go build in $here"
	fi
	install_bins "$tmp" "${want[@]}"
	echo "$key" >"$out/.key"
	echo "kubelet build: done in $((SECONDS - start)) s"
fi
# Release .build.lock before the control plane, so that plain callers never
# wait for it.
flock -u 9
exec 9>&-

[[ $cluster == 1 ]] || exit 0

# The control-plane step, under .cluster.lock (fd 8).
exec 8>"$out/.cluster.lock"
flock 8

etcdmod=$here/etcd
prommod=$here/prometheus
ckey=$(cat go.mod go.sum build.sh "$etcdmod/go.mod" "$etcdmod/go.sum" \
	"$prommod/go.mod" "$prommod/go.sum" | sha256sum | cut -c1-16)
k8scmds=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
cwant=()
for c in "${k8scmds[@]}"; do
	cwant+=("$out/$c")
done
cwant+=("$out/etcd" "$out/prometheus")
if fresh "$out/.cluster-key" "$ckey" "${cwant[@]}"; then
	exit 0
fi
etcdver=$(cd "$etcdmod" && "$gocmd" list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3) ||
	fail "go list of go.etcd.io/etcd/server/v3 in $etcdmod"
# The module github.com/prometheus/prometheus v0.3XX.Y is Prometheus
# 3.XX.Y; its VERSION file says which. `go list -m` names the module's
# directory only once the module is in the module cache: download it first
# (a new machine has an empty cache).
(cd "$prommod" && "$gocmd" mod download github.com/prometheus/prometheus) ||
	fail "go mod download of github.com/prometheus/prometheus in $prommod"
promdir=$(cd "$prommod" && "$gocmd" list -m -f '{{.Dir}}' github.com/prometheus/prometheus) ||
	fail "go list of github.com/prometheus/prometheus in $prommod"
[[ -n $promdir ]] || fail "go list names no directory for github.com/prometheus/prometheus in $prommod"
promver=$(cat "$promdir/VERSION") || fail "no VERSION file in $promdir"
echo "kubelet build: building ${k8scmds[*]} $version, etcd $etcdver and prometheus $promver into $out (minutes, longer on a cold Go cache)"
start=$SECONDS
rm -f "$out/.cluster-key"
tmp=$(mktemp -d "$out/.cluster.XXXXXX")
tmps+=("$tmp")
pkgs=()
for c in "${k8scmds[@]}"; do
	pkgs+=("k8s.io/kubernetes/cmd/$c")
done
if ! CGO_ENABLED=0 "$gocmd" build -trimpath -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}"; then
	fail "go build of ${k8scmds[*]} in $here"
fi
# etcd's own build stamps the git commit it was built from, "GitNotFound"
# when there is none, as in a module build (etcd --version otherwise says
# "Not provided (use ./build instead of go build)"); its version comes
# from go.etcd.io/etcd/api/v3.
if ! (cd "$etcdmod" && CGO_ENABLED=0 "$gocmd" build -trimpath \
	-ldflags "-X go.etcd.io/etcd/api/v3/version.GitSHA=GitNotFound" \
	-o "$tmp/etcd" go.etcd.io/etcd/server/v3); then
	fail "go build of etcd in $etcdmod"
fi
# Prometheus: the ldflags its release build (.promu.yml) sets, so that
# --version and prometheus_build_info are right; a module has no git
# revision or branch, so Revision is the module version. remove_all_sd
# drops every service discovery but static, file and http;
# enable_kubernetes_sd adds Kubernetes back (see its plugins/*.go). No
# builtinassets tag: the web UI is not embedded, so its pages answer 500
# (no index.html); the HTTP API and /-/ready are unaffected.
pstart=$SECONDS
pvar=github.com/prometheus/common/version
promldflags="-X $pvar.Version=$promver"
promldflags+=" -X $pvar.Revision=$(cd "$prommod" && "$gocmd" list -m -f '{{.Version}}' github.com/prometheus/prometheus)"
promldflags+=" -X $pvar.Branch=HEAD"
promldflags+=" -X $pvar.BuildUser=$(id -un 2>/dev/null || echo unknown)@$(hostname 2>/dev/null || echo unknown)"
promldflags+=" -X $pvar.BuildDate=$(date -u +%Y%m%d-%H:%M:%S)"
if ! (cd "$prommod" && CGO_ENABLED=0 "$gocmd" build -trimpath \
	-tags remove_all_sd,enable_kubernetes_sd -ldflags "$promldflags" \
	-o "$tmp/prometheus" github.com/prometheus/prometheus/cmd/prometheus); then
	fail "go build of prometheus in $prommod"
fi
echo "kubelet build: prometheus $promver built in $((SECONDS - pstart)) s"
install_bins "$tmp" "${cwant[@]}"
echo "$ckey" >"$out/.cluster-key"
echo "kubelet build: control plane done in $((SECONDS - start)) s"
