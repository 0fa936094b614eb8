#!/usr/bin/env bash
# The load harness: runs the tests with every core kept busy, RUNS times,
# and reports every failure with its log. A test that fails here fails by
# chance somewhere else: fix its cause (see README, "Run the tests").
#
#   test/load.sh [-n RUNS] [--cpu N] [--io] [--ci] [PACKAGE...] [-- GO-TEST-FLAGS...]
#
#   -n RUNS    how many runs (default 5)
#   --cpu N    CPU spinners of the hog (default: one per core, so the tests
#              get about half the machine); 0 for none
#   --io       the hog also writes and fsyncs 1 MiB files in $TMPDIR
#   --ci       run .ci/run (go vet and every suite, as CI does) instead of
#              go test on PACKAGEs
#   PACKAGE    packages for `go test -race -count=1` (default ./...), read
#              through test/report like CI's; GO-TEST-FLAGS after --
#              (e.g. -- -run TestPLEG -timeout 30m)
#
# The hog (test/hog) runs at normal priority beside each run and is
# stopped after it, also on Ctrl-C. Each run's log is kept in a work
# directory printed at the start; at the end a summary gives every run's
# result and time and, for each failure, the failing tests and the log.
# Exits 0 only when every run passed. Runs as the user the tests need (root
# for the e2e suites).
set -euo pipefail

runs=5
cpu=$(nproc)
io=0
ci=0
pkgs=()
flags=()
while (($#)); do
	case $1 in
	-n) runs=$2; shift ;;
	--cpu) cpu=$2; shift ;;
	--io) io=1 ;;
	--ci) ci=1 ;;
	--) shift; flags=("$@"); break ;;
	-h | --help) sed -n '2,24p' "$0"; exit 0 ;;
	-*) echo "load: unknown flag $1 (see --help)" >&2; exit 2 ;;
	*) pkgs+=("$1") ;;
	esac
	shift
done
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "load: -n must be a positive number, not $runs" >&2; exit 2; }
[[ $cpu =~ ^[0-9]+$ ]] || { echo "load: --cpu must be a number, not $cpu" >&2; exit 2; }
if ((ci)) && ((${#pkgs[@]} || ${#flags[@]})); then
	echo "load: --ci runs the whole CI; it takes no packages or go test flags" >&2
	exit 2
fi
((${#pkgs[@]})) || pkgs=(./...)

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
export PATH="$PATH:/usr/local/go/bin"
work=$(mktemp -d /tmp/pleg-load-XXXXXX)
go build -o "$work/report" ./test/report
# shellcheck source=hog/hog.sh
. "$repo/test/hog/hog.sh"
hog_build "$work"

what="go test -race -count=1 ${flags[*]} ${pkgs[*]}"
((ci)) && what=".ci/run"
echo "load: $runs run(s) of $what with $cpu CPU spinner(s)$( ((io)) && echo ' and I/O'); logs in $work"

results=()
failed=0
for i in $(seq 1 "$runs"); do
	log=$work/run$i.log
	hog_start "$cpu" "$io" "$work/hog$i.log"
	start=$(date +%s)
	status=0
	if ((ci)); then
		bash .ci/run >"$log" 2>&1 || status=$?
	else
		{ go test -race -count=1 -json "${flags[@]}" "${pkgs[@]}" 2>&1 | "$work/report"; } >"$log" 2>&1 || status=$?
	fi
	took=$(($(date +%s) - start))
	hog_stop
	load=$(cut -d' ' -f1-3 /proc/loadavg)
	count=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n1 || true)
	if ((status == 0)); then
		results+=("run $i: PASS in ${took}s (${count:-no count}; load average at the end $load)")
	else
		failed=$((failed + 1))
		results+=("run $i: FAIL (exit $status) in ${took}s (${count:-no count}; load average at the end $load); log $log")
	fi
	echo "load: ${results[-1]}"
done

echo
echo "load: summary of $runs run(s) of $what under load ($cpu CPU spinner(s)$( ((io)) && echo ', I/O')):"
printf '  %s\n' "${results[@]}"
if ((failed)); then
	echo
	for i in $(seq 1 "$runs"); do
		log=$work/run$i.log
		grep -qE '^(--- FAIL|FAIL|build failed|panic:)' "$log" || continue
		echo "== run $i failures ($log):"
		grep -E '^\s*--- FAIL|^FAIL\s|^build failed|^panic:' "$log" | sed 's/^/  /' | head -50
	done
	echo
	echo "load: $failed of $runs run(s) failed"
	exit 1
fi
echo "load: every run passed"
