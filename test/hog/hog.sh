# Sourced by test/load.sh and test/fresh-machine.sh: runs the hog (this
# directory's program) beside a run and stops it after, also on Ctrl-C.
#
#   hog_build DIR           builds the hog into DIR/hog (the caller's Go caches)
#   hog_start CPU IO LOG    starts DIR/hog with CPU spinners (IO=1: fsync'd writes)
#   hog_stop                stops it, if running
# hog_build installs the EXIT/INT/TERM traps that stop it.

hog_bin=
hog_pid=

hog_build() {
	hog_bin=$1/hog
	(cd "$(dirname "${BASH_SOURCE[0]}")" && go build -o "$hog_bin" .)
	trap 'hog_stop' EXIT
	trap 'hog_stop; exit 130' INT TERM
}

hog_start() {
	local args=(-cpu "$1")
	if (($2)); then args+=(-io); fi
	"$hog_bin" "${args[@]}" >"$3" 2>&1 &
	hog_pid=$!
}

hog_stop() {
	if [[ -n $hog_pid ]]; then
		kill -TERM "$hog_pid" 2>/dev/null || true
		wait "$hog_pid" 2>/dev/null || true
		hog_pid=
	fi
}
