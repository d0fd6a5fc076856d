#!/usr/bin/env bash
# The README's main job: build fusiond and fusionctl, start the daemon on
# the development config (everything under ./_run, no root needed), submit
# the mixed workload in examples/workload, show it flowing through the
# lifecycle, then stop the daemon. Set DEMO_KEEP=1 to leave it running.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=./_run
CTL="./bin/fusionctl --socket $RUN/fusiond.sock"
mkdir -p "$RUN"
rm -rf "$RUN/state" "$RUN/fusiond.sock" "$RUN/metrics.sock"

LOG=$RUN/fusiond.log
echo "==> starting fusiond (development config: examples/dev-config.yaml; its log: $LOG)"
# fusiond itself is the background job, so $! is its own PID: stop signals
# that process alone, never another daemon that happens to match a
# pattern. Its log goes to a file so that the story below stays readable.
./bin/fusiond --config examples/dev-config.yaml "$@" > "$LOG" 2>&1 &
DAEMON_PID=$!
stop() {
  kill -TERM "$DAEMON_PID" 2>/dev/null || true
  wait "$DAEMON_PID" 2>/dev/null || true
}
trap stop EXIT
# The first start of the simulated host writes its sysfs trees (well under
# a second; `make start-time` measures it).
for _ in $(seq 1 300); do
  $CTL status >/dev/null 2>&1 && break
  if ! kill -0 "$DAEMON_PID" 2>/dev/null; then
    echo "fusiond exited; its log ($LOG):" >&2
    sed 's/^/    /' "$LOG" >&2
    exit 1
  fi
  sleep 0.1
done
$CTL status

echo
echo "==> the simulated host's topology: the PCIe tree of socket 0 (fusionctl topology)"
$CTL topology | sed -n '/^PCIe/,/^  pci0000:30/p' | sed '$d' | sed 's/^/    /'
echo "    ... (fusionctl topology --matrix prints the nvidia-smi-style distance matrix)"
echo
echo "==> GPUs (fusionctl gpu list)"
$CTL gpu list | sed 's/^/    /'
echo
echo "==> a MIG layout in mig-parted format, planned but not applied"
echo "    (fusionctl mig plan -f examples/mig-layouts.yaml -c inference-split)"
$CTL mig plan -f examples/mig-layouts.yaml -c inference-split | sed 's/^/    /'
echo
echo "==> FPGA regions, and a sample bitstream added to the library and programmed"
$CTL fpga list | sed 's/^/    /'
# fusiond --simulate writes sample bitstreams for its simulated FPGAs here.
$CTL fpga bitstream add "$RUN/state/sim/fpga-samples/dma.gbs" | sed 's/^/    /'
$CTL fpga program dfl/0000:af:00.0/0 dma | sed 's/^/    /'
$CTL fpga list | sed 's/^/    /'

echo
echo "==> submitting the mixed workload"
for f in examples/workload/*.yaml; do
  ids=$($CTL submit -q "$f")
  echo "    $f → job $(echo $ids | tr ' ' ,)"
done
# The flaky job is found by its name, wherever its file sorts.
FLAKY=$($CTL ps --limit 100 | awk '$2 == "flaky-fetch" { print $1; exit }')
NOTEBOOK=$($CTL run -q --name sleepy-notebook --class batch --cpu 100m --memory 32Mi -- sleep 600)
echo "    sleepy-notebook → job $NOTEBOOK (will be cancelled)"

echo
echo "==> a job that asks for more than this host has is refused at once:"
$CTL run --name too-big --cpu 4096 --memory 1Gi -- true 2>&1 | sed 's/^/    /' || true

sleep 1
echo
echo "==> jobs in flight"
$CTL ps
echo
echo "==> the live view, one plain frame (fusionctl top --once; on a terminal fusionctl top refreshes every second)"
$CTL top --once | sed 's/^/    /'
if command -v curl >/dev/null; then
  echo
  echo "==> a few Prometheus metrics (curl --unix-socket $RUN/metrics.sock http://fusiond/metrics)"
  curl -s --unix-socket "$RUN/metrics.sock" http://fusiond/metrics |
    grep -E '^fusiond_(queue_length|jobs\{|placement_decisions_total|node_gpus)' | head -12 | sed 's/^/    /'
fi
$CTL cancel -q "$NOTEBOOK" >/dev/null
echo "    cancelled sleepy-notebook (job $NOTEBOOK)"

for _ in $(seq 1 60); do
  [ -z "$($CTL ps -q --state pending,placed,starting,running)" ] && break
  sleep 1
done
echo
echo "==> final state"
$CTL ps
echo
echo "==> the flaky job's history (restarted after a failure):"
$CTL show "$FLAKY"
echo
echo "==> the training gang's output:"
for id in $($CTL ps -q --class training); do
  $CTL logs "$id" | sed "s/^/    [job $id] /"
done
echo
$CTL status
echo
echo "==> fusiond wrote $(wc -l < "$LOG") log lines to $LOG; its warnings and errors:"
grep -E 'level=(WARN|ERROR)' "$LOG" | sed 's/^/    /' || echo "    none"
if [ "${DEMO_KEEP:-}" = 1 ]; then
  echo
  echo "==> DEMO_KEEP=1: fusiond keeps running (PID $DAEMON_PID) and this terminal waits for it."
  echo "    From a second terminal, in $(pwd):"
  echo "      $CTL ps"
  echo "      $CTL top"
  echo "      tail -f $LOG"
  echo "    Ctrl-C here stops fusiond."
  wait "$DAEMON_PID"
fi
