#!/usr/bin/env bash
# Start-up time of `fusiond --simulate dgxh200` (what `make run` starts):
# the wall time from launching the daemon to the first answer of
# `fusionctl status`, and the daemon's CPU time until then, RUNS times
# (default 5) each of
#   first:  nothing there yet: an empty state directory and no simulated
#           topology tree in /dev/shm/fusiond-UID (both are written);
#   fresh:  an empty state directory, the shared topology tree kept (what
#           `make run` meets from its second run on);
#   warm:   the same state directory again.
# Prints every run and the medians. `make start-time` builds and runs it.
# It removes this user's simulated topology trees from /dev/shm for the
# first kind: other simulated daemons of this user write them again.
#   [FUSIOND_BIN=DIR] .ci/start-time.sh [RUNS]    (DIR: fusiond and fusionctl, default bin/)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
bin=${FUSIOND_BIN:-bin}
for b in "$bin/fusiond" "$bin/fusionctl"; do
  [ -x "$b" ] || { echo "start-time: $b missing (make build, or FUSIOND_BIN=DIR)" >&2; exit 1; }
done
work=$(mktemp -d /tmp/fusiond-start.XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
cat > "$work/config.yaml" <<EOF
state_dir: $work/state
socket: $work/fusiond.sock
socket_group: ""
socket_mode: "0600"
allow_unisolated_jobs: true
leave_jobs_on_shutdown: false
simulate: dgxh200
EOF
tck=$(getconf CLK_TCK)
# one KIND: starts the daemon, waits for its first answer, prints
# "ms cpu_ms", stops it.
one() {
  local s e stat
  s=$(date +%s%N)
  "$bin/fusiond" --config "$work/config.yaml" > "$work/log" 2>&1 &
  pid=$!
  for _ in $(seq 1 6000); do
    "$bin/fusionctl" --socket "$work/fusiond.sock" status > /dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || { echo "start-time: fusiond exited:" >&2; cat "$work/log" >&2; exit 1; }
    sleep 0.005
  done
  e=$(date +%s%N)
  read -r -a stat < "/proc/$pid/stat"
  kill "$pid"; wait "$pid" || true; pid=
  echo "$(( (e - s) / 1000000 )) $(( (stat[13] + stat[14]) * 1000 / tck ))"
}
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : int((v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
: > "$work/first"; : > "$work/fresh"; : > "$work/warm"
for i in $(seq 1 "$runs"); do
  rm -rf "$work/state" "/dev/shm/fusiond-$(id -u)"/topology-*
  f=$(one)
  rm -rf "$work/state"
  n=$(one); w=$(one)
  echo "run $i: first ${f% *} ms (daemon CPU ${f#* } ms), fresh ${n% *} ms (CPU ${n#* } ms), warm ${w% *} ms (CPU ${w#* } ms)"
  echo "$f" >> "$work/first"; echo "$n" >> "$work/fresh"; echo "$w" >> "$work/warm"
done
line="median of $runs:"
for k in first fresh warm; do
  line="$line $k $(cut -d' ' -f1 "$work/$k" | median) ms (CPU $(cut -d' ' -f2 "$work/$k" | median) ms),"
done
echo "$line load average $(cut -d' ' -f1-3 /proc/loadavg)"
