#!/usr/bin/env bash
# Provision the real node-problem-detector for the test/npd suite: builds
# k8s.io/node-problem-detector's cmd/nodeproblemdetector at $NPD_VERSION
# (default v1.36.0) from its module source, CGO_ENABLED=0, with the tags that
# leave out the system log monitor (journald needs cgo), the system stats
# monitor and the Stackdriver exporter, none of which the suite uses.
# The binary lands at $PLEG_NPD_CACHE/bin/node-problem-detector (default
# cache <repo>/.cache/npd) and is rebuilt only when it is missing or
# reports another version (--version). A cold build takes ~4 minutes on a
# 2-core machine; a warm run, well under a second.
#
# Environment: GO (go command, default: go on PATH, else /usr/local/go/bin/go),
# PLEG_NPD_CACHE (cache dir), NPD_VERSION.
# Exits non-zero with a message starting "provision: FAILED" when it cannot.
set -euo pipefail

NPD_VERSION=${NPD_VERSION:-v1.36.0}
NPD_TAGS="disable_system_log_monitor disable_system_stats_monitor disable_stackdriver_exporter"
NPD_MODULE=k8s.io/node-problem-detector

say() { echo "provision: $*"; }
fail() {
	echo "provision: FAILED: $*" >&2
	exit 1
}

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd "$script_dir/../.." && pwd)
[[ -f $repo_root/go.mod ]] || fail "cannot find the repository root (no go.mod in $repo_root)"
cache=${PLEG_NPD_CACHE:-$repo_root/.cache/npd}
bin=$cache/bin
mkdir -p "$bin"

# One provisioning at a time per cache dir (go test runs test binaries in
# parallel, and two runs of the suite may share the cache).
if command -v flock >/dev/null 2>&1; then
	exec 9>"$cache/provision.lock"
	flock 9
fi

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

npd=$bin/node-problem-detector
have_npd() {
	[[ -x $npd ]] || return 1
	local out
	out=$("$npd" --version 2>/dev/null) || return 1
	[[ $out == "$NPD_VERSION" ]]
}

if have_npd; then
	say "node-problem-detector $NPD_VERSION: $npd (cached)"
	exit 0
fi

start=$(date +%s)
say "building node-problem-detector $NPD_VERSION into $bin from its module source (takes ~4 minutes cold)"
# Not go install module@version: it asks the proxy for the module's version
# list (to look for a deprecation), which the proxy refuses here. So
# download that exact version, copy it (the module cache is read-only) and
# build the copy, as test/e2e/provision.sh does for containerd 1.7.
src=$(cd "$cache" && GOFLAGS= GOWORK=off "$gocmd" mod download -json "$NPD_MODULE@$NPD_VERSION" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p') || true
[[ -n $src && -d $src ]] || fail "go mod download $NPD_MODULE@$NPD_VERSION failed (needs the Go module proxy)"
tmp=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cp -r "$src" "$tmp/src" && chmod -R u+w "$tmp/src" || fail "copying the $NPD_MODULE source to $tmp/src failed"
(
	cd "$tmp/src"
	# Niced: go test runs the other suites meanwhile, some of them timing
	# what real runtimes do.
	CGO_ENABLED=0 GOFLAGS=-mod=mod GOWORK=off nice -n 10 "$gocmd" build -tags "$NPD_TAGS" \
		-ldflags "-X $NPD_MODULE/pkg/version.version=$NPD_VERSION" \
		-o "$tmp/node-problem-detector" ./cmd/nodeproblemdetector
) || fail "building $NPD_MODULE@$NPD_VERSION from $tmp/src failed"
mv -f "$tmp/node-problem-detector" "$npd"
have_npd || fail "$npd does not report version $NPD_VERSION after the build: $("$npd" --version 2>&1 | head -n1)"
say "node-problem-detector $NPD_VERSION built in $(($(date +%s) - start))s: $npd"
