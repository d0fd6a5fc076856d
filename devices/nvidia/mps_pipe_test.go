package nvidia

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/fusiond/fusiond/devices"
)

// fakeControl writes a stand-in for nvidia-cuda-mps-control into a temp
// directory: "-d" creates the control pipe and records who owns the pipe
// and log directories then; otherwise it appends every stdin line to the
// record, answers get_server_list with the PIDs in the pipe directory's
// server.pid (written by the test when "the user's server" starts) and
// removes the control pipe on quit. It returns the binary and the record.
func fakeControl(t *testing.T) (bin, record string) {
	t.Helper()
	dir := t.TempDir()
	bin, record = filepath.Join(dir, "nvidia-cuda-mps-control"), filepath.Join(dir, "record")
	script := `#!/bin/sh
rec='` + record + `'
if [ "$1" = "-d" ]; then
	echo "-d $CUDA_VISIBLE_DEVICES pipe=$(stat -c %u:%g:%a "$CUDA_MPS_PIPE_DIRECTORY") log=$(stat -c %u:%g:%a "$CUDA_MPS_LOG_DIRECTORY")" >>"$rec"
	: >"$CUDA_MPS_PIPE_DIRECTORY/control"
	exit 0
fi
while IFS= read -r line; do
	echo "$line" >>"$rec"
	case "$line" in
	get_server_list) [ -f "$CUDA_MPS_PIPE_DIRECTORY/server.pid" ] && cat "$CUDA_MPS_PIPE_DIRECTORY/server.pid" ;;
	quit) rm -f "$CUDA_MPS_PIPE_DIRECTORY/control" ;;
	esac
done
exit 0
`
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, record
}

// takeRecord returns the lines recorded since the last call.
func takeRecord(t *testing.T, record string) []string {
	t.Helper()
	b, err := os.ReadFile(record)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(record); err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// ownerMode is "uid:gid:mode" of path, as stat -c %u:%g:%a writes it.
func ownerMode(t *testing.T, path string) string {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d:%d:%o", st.Uid, st.Gid, st.Mode&0o7777)
}

// TestMPSLimitsThroughControlPipe runs the production MPSDaemon (ExecRunner,
// stdin commands) against a fake control binary, through the driver's
// Prepare/Release as the daemon calls them: the limits the pipe gets are
// the sum of the user's shares, the job's environment carries its own
// share, another user is refused while the GPU serves a user, and the pipe
// and log directories belong to the served user and go back to root.
func TestMPSLimitsThroughControlPipe(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test chowns directories and must run as root")
	}
	bin, record := fakeControl(t)
	root := t.TempDir()
	mps := &MPSDaemon{Root: root, Binary: bin}
	m, _ := openSim(t, "dgxh100", WithMPS(mps))
	drv := NewDriver(m, nil, DriverOptions{})
	gpu := m.GPUs()[0].UUID
	pipe, logDir := mps.Dirs(gpu)
	ctx := context.Background()

	share := func(milli int, memMB int64, uid uint32) *devices.Allocation {
		return &devices.Allocation{Share: &devices.Share{Device: gpu, Milli: milli, MemoryMB: memMB, UID: uid, GID: uid + 1}}
	}
	// First share of uid 1000: the control daemon starts with the
	// directories already the user's, then the defaults are set before
	// any server exists.
	gr, err := drv.Prepare(ctx, "a", share(250, 4096, 1000))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"-d " + gpu + " pipe=1000:1001:700 log=1000:1001:700",
		"set_default_active_thread_percentage 25",
		"set_default_device_pinned_mem_limit 0 4096M",
		"get_server_list",
	}
	if got := takeRecord(t, record); !slices.Equal(got, want) {
		t.Fatalf("first share: pipe got\n%q\nwant\n%q", got, want)
	}
	if gr.Env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "25" || gr.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=4096M" ||
		gr.Env["CUDA_MPS_PIPE_DIRECTORY"] != pipe || gr.Env["CUDA_MPS_LOG_DIRECTORY"] != logDir {
		t.Fatalf("job a env %v", gr.Env)
	}
	if got := ownerMode(t, filepath.Dir(pipe)); got != "0:0:755" {
		t.Errorf("GPU directory %s", got)
	}
	for _, d := range []string{pipe, logDir} {
		if got := ownerMode(t, d); got != "1000:1001:700" {
			t.Errorf("%s owned %s, want 1000:1001:700", d, got)
		}
	}

	// Job a's CUDA init made the control daemon start uid 1000's server;
	// its server writes a log as the user.
	if err := os.WriteFile(filepath.Join(pipe, "server.pid"), []byte("4242\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srvLog := filepath.Join(logDir, "server.log")
	if err := os.WriteFile(srvLog, []byte("server up\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(srvLog, 1000, 1001); err != nil {
		t.Fatal(err)
	}

	// A second share of the same user: the running server is raised to
	// the user's total; the job's environment is its own share.
	gr, err = drv.Prepare(ctx, "b", share(300, 2048, 1000))
	if err != nil {
		t.Fatal(err)
	}
	want = []string{
		"set_default_active_thread_percentage 55",
		"set_default_device_pinned_mem_limit 0 6144M",
		"get_server_list",
		"set_active_thread_percentage 4242 55",
		"set_device_pinned_mem_limit 4242 0 6144M",
	}
	if got := takeRecord(t, record); !slices.Equal(got, want) {
		t.Fatalf("second share: pipe got\n%q\nwant\n%q", got, want)
	}
	if gr.Env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "30" || gr.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=2048M" {
		t.Fatalf("job b env %v", gr.Env)
	}

	// Another user while the GPU serves uid 1000: refused, nothing sent.
	if _, err := drv.Prepare(ctx, "c", share(100, 1024, 2000)); !errors.Is(err, ErrShareUser) ||
		!strings.Contains(err.Error(), "uid 2000") || !strings.Contains(err.Error(), "serves uid 1000") {
		t.Fatalf("other user's share: %v", err)
	}
	if got := takeRecord(t, record); got != nil {
		t.Fatalf("refused share reached the pipe: %q", got)
	}
	if st := m.ShareStatuses()[0]; st.UsedMilli != 550 || len(st.Shares) != 2 {
		t.Fatalf("after refusal: %+v", st)
	}

	// a leaves: the server is lowered to b's share.
	if err := drv.Release(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	want = []string{
		"set_default_active_thread_percentage 30",
		"set_default_device_pinned_mem_limit 0 2048M",
		"get_server_list",
		"set_active_thread_percentage 4242 30",
		"set_device_pinned_mem_limit 4242 0 2048M",
	}
	if got := takeRecord(t, record); !slices.Equal(got, want) {
		t.Fatalf("release a: pipe got\n%q\nwant\n%q", got, want)
	}

	// The last share leaves: the daemon quits and everything is root's.
	if err := drv.Release(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if got := takeRecord(t, record); !slices.Equal(got, []string{"quit"}) {
		t.Fatalf("last release: pipe got %q", got)
	}
	for _, p := range []string{pipe, logDir} {
		if got := ownerMode(t, p); got != "0:0:700" {
			t.Errorf("%s after quit: %s, want 0:0:700", p, got)
		}
	}
	if got := ownerMode(t, srvLog); !strings.HasPrefix(got, "0:0:") {
		t.Errorf("server log after quit: %s, want root's", got)
	}

	// Now uid 2000 may use the GPU: its directories are its own and the
	// earlier user's log is kept aside, root's.
	if err := os.Remove(filepath.Join(pipe, "server.pid")); err != nil {
		t.Fatal(err)
	}
	if _, err := drv.Prepare(ctx, "c", share(100, 1024, 2000)); err != nil {
		t.Fatal(err)
	}
	if got := takeRecord(t, record); len(got) != 4 || got[0] != "-d "+gpu+" pipe=2000:2001:700 log=2000:2001:700" ||
		got[1] != "set_default_active_thread_percentage 10" || got[2] != "set_default_device_pinned_mem_limit 0 1024M" {
		t.Fatalf("uid 2000: pipe got %q", got)
	}
	if got := ownerMode(t, logDir+".prev"); got != "0:0:700" {
		t.Errorf("log.prev %s", got)
	}
	if _, err := os.Stat(filepath.Join(logDir+".prev", "server.log")); err != nil {
		t.Errorf("earlier log not kept: %v", err)
	}
	if ents, _ := os.ReadDir(logDir); len(ents) != 0 {
		t.Errorf("uid 2000's log directory holds %v", ents)
	}
	if err := drv.Release(ctx, "c"); err != nil {
		t.Fatal(err)
	}
}

// TestMPSLimitsIgnoreJobEnv: the limits the pipe gets come from the share
// alone. A job whose own environment asks for the whole GPU (as a spec's
// env: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100) is granted, and has written
// to its server's defaults, its share's values; the daemon's executor puts
// the grant's values in place of the job's (executor.withDeviceEnv).
func TestMPSLimitsIgnoreJobEnv(t *testing.T) {
	bin, record := fakeControl(t)
	mps := &MPSDaemon{Root: t.TempDir(), Binary: bin}
	m, _ := openSim(t, "dgxh100", WithMPS(mps))
	drv := NewDriver(m, nil, DriverOptions{})
	gpu := m.GPUs()[1].UUID
	t.Setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100") // even fusiond's own environment does not count
	t.Setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=80000M")
	gr, err := drv.Prepare(context.Background(), "j", &devices.Allocation{Share: &devices.Share{Device: gpu, Milli: 125, MemoryMB: 512, UID: 1000, GID: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	got := takeRecord(t, record)
	if !slices.Contains(got, "set_default_active_thread_percentage 13") || !slices.Contains(got, "set_default_device_pinned_mem_limit 0 512M") {
		t.Fatalf("pipe got %q", got)
	}
	if gr.Env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "13" || gr.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=512M" {
		t.Fatalf("grant env %v", gr.Env)
	}
	if err := drv.Release(context.Background(), "j"); err != nil {
		t.Fatal(err)
	}
}

// TestMPSLimitsFailure: a pipe that refuses the limits leaves nothing
// admitted and the daemon stopped.
func TestMPSLimitsFailure(t *testing.T) {
	root := t.TempDir()
	var lines []string
	mps := &MPSDaemon{Root: root, Binary: "/bin/true", Run: func(_ context.Context, _ []string, stdin, _ string, args ...string) (string, error) {
		lines = append(lines, strings.TrimSpace(stdin+strings.Join(args, " ")))
		if strings.HasPrefix(stdin, "set_default_device_pinned_mem_limit") {
			return "", errors.New("unknown command")
		}
		return "", nil
	}}
	m, _ := openSim(t, "dgxh100", WithMPS(mps))
	gpu := m.GPUs()[0].UUID
	err := m.AdmitShare(context.Background(), Share{ID: "x", GPU: gpu, Milli: 100, MemoryMB: 10, UID: 5, GID: 5})
	if err == nil || !strings.Contains(err.Error(), "set_default_device_pinned_mem_limit") {
		t.Fatalf("admit: %v", err)
	}
	if st := m.ShareStatuses()[0]; len(st.Shares) != 0 {
		t.Fatalf("share left admitted: %+v", st)
	}
	// No control pipe was created (the Run above does not), so Stop sends
	// nothing, but gives the directories back to root.
	pipe, _ := mps.Dirs(gpu)
	if got := ownerMode(t, pipe); got != "0:0:700" {
		t.Errorf("pipe after failure %s", got)
	}
	if want := []string{"-d", "set_default_active_thread_percentage 10", "set_default_device_pinned_mem_limit 0 10M"}; !slices.Equal(lines, want) {
		t.Errorf("commands %q, want %q", lines, want)
	}
}
