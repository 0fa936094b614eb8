#!/usr/bin/env bash
# Proves that a new machine passes CI: as root on Debian, it removes what
# the suites install, makes a fresh clone of this repository's HEAD and
# runs .ci/run there, RUNS times in a row (default 3), printing each run's
# time and result.
#
#   sudo test/fresh-machine.sh [-n RUNS] [--cpu N] [--io] [--warm-go] [--keep]
#
# --cpu N runs the load harness's hog (test/hog, N CPU spinners; --cpu
# $(nproc) keeps every core busy) beside each run, and --io adds its
# fsync'd writes: a fresh machine that is also busy. The hog is built
# before the runs, with the caller's Go caches, and stopped after each.
#
# Before every run it removes:
#   - the Debian packages the suites install (runc, chromium, prometheus and the
#     packages only they pulled in, via autoremove);
#   - the repository's .cache/e2e (runtimes, kubelet, images), .cache/npd and
#     .cache/crictl (the clone has no .cache at all, so every suite builds
#     and fetches again); npm's own cache is an empty directory for each run;
#   - unless --warm-go: the Go build and module caches, by pointing GOCACHE
#     and GOMODCACHE at empty directories (a new machine has neither).
# Each run's full log is kept in the work directory (printed at the end);
# --keep keeps the clones too.
#
# Exits 0 only when every run passed.
set -euo pipefail

runs=3
warm_go=0
keep=0
cpu=0
io=0
while (($#)); do
	case $1 in
	-n) runs=$2; shift ;;
	--warm-go) warm_go=1 ;;
	--keep) keep=1 ;;
	--cpu) cpu=$2; shift ;;
	--io) io=1 ;;
	-h | --help) sed -n '2,24p' "$0"; exit 0 ;;
	*) echo "fresh-machine: unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done

[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "fresh-machine: -n must be a positive number, not $runs" >&2; exit 2; }
[[ $cpu =~ ^[0-9]+$ ]] || { echo "fresh-machine: --cpu must be a number, not $cpu" >&2; exit 2; }
((io && !cpu)) && { echo "fresh-machine: --io needs --cpu N (the hog)" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "fresh-machine: must run as root (it removes system packages)" >&2; exit 2; }
command -v apt-get >/dev/null || { echo "fresh-machine: needs Debian's apt-get" >&2; exit 2; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && git rev-parse --show-toplevel)
head=$(git -C "$repo" rev-parse --short HEAD)
work=$(mktemp -d /tmp/pleg-fresh-XXXXXX)
go=$(command -v go || echo /usr/local/go/bin/go)
load=
if ((cpu)); then
	load=" beside a hog of $cpu CPU spinner(s)"
	((!io)) || load+=" and I/O"
fi
echo "fresh-machine: $runs run(s) of .ci/run on fresh clones of $repo at $head$load; logs in $work"

if ((cpu)); then
	# shellcheck source=hog/hog.sh
	. "$repo/test/hog/hog.sh"
	PATH=$PATH:$(dirname "$go") hog_build "$work"
fi

# What the suites install. chromium-common and chromium-sandbox come with
# chromium; autoremove then drops the libraries only they needed. containerd
# is Debian's 1.6 for the e2e suite (test/e2e runs its own process of it);
# prometheus (and promtool) is for deploy's rule tests; busybox-static is
# the base of test/e2e's pleg image; conmon, containernetworking-plugins
# and skopeo are for test/e2e's CRI-O (its monitor, the loopback CNI plugin,
# the image import).
packages=(containerd runc busybox-static chromium chromium-common chromium-sandbox chromium-driver prometheus
	conmon containernetworking-plugins skopeo)

unprovision() {
	local present=() p
	for p in "${packages[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q ' installed$' && present+=("$p")
	done
	if ((${#present[@]})); then
		echo "fresh-machine: removing ${present[*]}"
		DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600 purge -y "${present[@]}" >"$work/apt-remove.log" 2>&1
		DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600 autoremove --purge -y >>"$work/apt-remove.log" 2>&1
	fi
	for p in containerd runc busybox chromium promtool conmon skopeo; do
		if command -v "$p" >/dev/null; then
			echo "fresh-machine: $p is still on PATH ($(command -v $p)) after removing the packages" >&2
			exit 1
		fi
	done
	# Debian's package lists too: a new machine may have none.
	rm -f /var/lib/apt/periodic/pleg-apt-install-update
	rm -rf "$repo/.cache/e2e" "$repo/.cache/npd" "$repo/.cache/crictl"
	# skopeo (test/e2e's CRI-O images) keeps its blob-info cache there
	# when run as root, whatever storage it writes to.
	rm -f /var/lib/containers/cache/blob-info-cache-v1.boltdb
}

results=()
failed=0
for i in $(seq 1 "$runs"); do
	unprovision
	clone=$work/run$i/pleg
	git clone -q --no-hardlinks "$repo" "$clone"
	# CI clones main with shared/ beside it.
	[[ -d $repo/../shared ]] && ln -s "$(cd "$repo/../shared" && pwd)" "$work/run$i/shared"
	# npm's cache too: the Node client's packages come from the registry.
	mkdir -p "$work/run$i/npmcache"
	envs=(CI=true npm_config_cache="$work/run$i/npmcache")
	if ((!warm_go)); then
		mkdir -p "$work/run$i/gocache" "$work/run$i/gomodcache"
		envs+=(GOCACHE="$work/run$i/gocache" GOMODCACHE="$work/run$i/gomodcache")
	fi
	log=$work/run$i.log
	echo "fresh-machine: run $i of $runs: started $(date -u +%H:%M:%S)Z"
	if ((cpu)); then hog_start "$cpu" "$io" "$work/hog$i.log"; fi
	start=$(date +%s)
	set +e
	(cd "$clone" && env "${envs[@]}" bash .ci/run </dev/null >"$log" 2>&1)
	code=$?
	set -e
	took=$(($(date +%s) - start))
	if ((cpu)); then hog_stop; fi
	if ((code == 0)); then
		res=PASS
	else
		res="FAIL (exit $code)"
		failed=1
	fi
	line="run $i: $res in ${took}s ($((took / 60))m$((took % 60))s); $(tail -n1 "$log")"
	results+=("$line")
	echo "fresh-machine: $line"
	if ((code != 0)); then
		echo "fresh-machine: last lines of $log:"
		tail -n 60 "$log" | sed 's/^/    /'
	fi
	if ((!keep)); then
		chmod -R u+w "$work/run$i" 2>/dev/null || true
		rm -rf "$work/run$i"
	fi
done

echo
echo "fresh-machine: $head, $runs run(s)$load:"
printf '  %s\n' "${results[@]}"
echo "fresh-machine: logs in $work"
exit $failed
