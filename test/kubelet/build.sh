#!/usr/bin/env bash
# build.sh OUTDIR: build the real kubelet v1.37.2 and this module's programs
# (./cmd/*) into OUTDIR, once: the binaries are kept until this module's
# go.mod, go.sum or Go sources change.
#
# Every suite that needs the kubelet (test/e2e, internal/bench) calls this
# script; it takes a lock in OUTDIR, so suites that run at once (go test runs
# test binaries in parallel) build once and never see half-written binaries.
#
# Environment: GO (go command, default: go on PATH, else /usr/local/go/bin/go).
# Exits non-zero with a message starting "kubelet build: FAILED".
set -euo pipefail

fail() {
	echo "kubelet build: FAILED: $*" >&2
	exit 1
}

[[ $# == 1 ]] || fail "usage: build.sh OUTDIR"
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

exec 9>"$out/.build.lock"
command -v flock >/dev/null 2>&1 || fail "flock is missing (util-linux)"
flock 9

cd "$here"
mapfile -t sources < <(find . -name '*.go' -o -name go.mod -o -name go.sum -o -name build.sh | LC_ALL=C sort)
key=$(cat "${sources[@]}" | sha256sum | cut -c1-16)
mapfile -t programs < <(find ./cmd -mindepth 1 -maxdepth 1 -type d 2>/dev/null | LC_ALL=C sort)
want=("$out/kubelet")
for p in "${programs[@]}"; do
	want+=("$out/$(basename "$p")")
done
if [[ -f $out/.key && $(cat "$out/.key") == "$key" ]]; then
	ok=1
	for b in "${want[@]}"; do
		[[ -x $b ]] || ok=0
	done
	if [[ $ok == 1 ]]; then
		exit 0
	fi
fi

version=v1.37.2
ldflags="-X k8s.io/component-base/version.gitVersion=$version"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$version"

echo "kubelet build: building the kubelet $version${programs:+ and ${programs[*]#./cmd/}} into $out (minutes on a cold Go cache)"
start=$SECONDS
rm -f "$out/.key"
tmp=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# Static binaries, as the kubelet's own release builds are.
if ! CGO_ENABLED=0 "$gocmd" build -trimpath -ldflags "$ldflags" -o "$tmp/" k8s.io/kubernetes/cmd/kubelet "${programs[@]}"; then
	fail "go build in $here"
fi
for b in "${want[@]}"; do
	[[ -x $tmp/$(basename "$b") ]] || fail "go build made no $(basename "$b")"
	mv -f "$tmp/$(basename "$b")" "$b"
done
echo "$key" >"$out/.key"
echo "kubelet build: done in $((SECONDS - start)) s"
