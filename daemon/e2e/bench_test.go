package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/executor/container"
)

// BenchmarkSubmitToRunning measures, through the daemon, the time from a
// job's submission (its record's creation) to its running event, for plain
// process jobs and for container jobs, and the memory of a job's monitor
// process. Jobs run one at a time.
//
//	go test -run '^$' -bench SubmitToRunning -benchtime 40x ./daemon/e2e/
func BenchmarkSubmitToRunning(b *testing.B) {
	dir, err := os.MkdirTemp("", "fusiond-bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	rootfs := filepath.Join(dir, "rootfs")
	bb, err := exec.LookPath("busybox")
	if err != nil {
		b.Fatal("busybox missing (apt-get install -y busybox-static)")
	}
	if err := container.BuildBusyboxRootfs(rootfs, bb); err != nil {
		b.Fatal(err)
	}
	for _, kind := range []string{"process", "container"} {
		b.Run(kind, func(b *testing.B) {
			d := newBenchDaemon(b, filepath.Join(dir, kind))
			c := api.NewClient(d.socket)
			defer c.Close()
			spec := api.JobSpec{Command: []string{"sleep", "0.3"}, Resources: api.Resources{CPU: 100, Memory: 32 << 20}}
			if kind == "container" {
				spec.Rootfs = rootfs
			}
			var lat, start []time.Duration
			var rss, pss []float64
			for b.Loop() {
				j, err := c.Submit(context.Background(), spec)
				if err != nil {
					b.Fatal(err)
				}
				running := waitState(b, c, j.ID, api.StateRunning)
				var starting time.Time
				for _, ev := range running.Events {
					switch ev.To {
					case api.StateStarting:
						starting = ev.Time
					case api.StateRunning:
						lat = append(lat, ev.Time.Sub(running.CreatedAt))
						start = append(start, ev.Time.Sub(starting))
					}
				}
				if r, p, ok := monitorMemory(filepath.Join(d.state, "jobs", j.ID, "attempt-1")); ok {
					rss, pss = append(rss, r), append(pss, p)
				}
				if end := waitTerminal(b, c, j.ID); end.State != api.StateSucceeded {
					b.Fatalf("job %s %s: %s", j.ID, end.State, end.Reason)
				}
			}
			slices.Sort(lat)
			slices.Sort(start)
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(lat[(len(lat)*99)/100].Microseconds())/1000, "p99-ms")
				// starting → running: the executor's part (monitor,
				// cgroup, held exec), without queueing and placement.
				b.ReportMetric(float64(start[len(start)/2].Microseconds())/1000, "start-p50-ms")
			}
			if len(rss) > 0 {
				b.ReportMetric(mean(rss), "monitor-RSS-KiB")
				b.ReportMetric(mean(pss), "monitor-PSS-KiB")
			}
		})
	}
}

func mean(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// monitorMemory reads the RSS and PSS (KiB) of an attempt's monitor.
func monitorMemory(attemptDir string) (rss, pss float64, ok bool) {
	var st struct {
		MonitorPID int `json:"monitor_pid"`
	}
	data, err := os.ReadFile(filepath.Join(attemptDir, "state.json"))
	if err != nil || json.Unmarshal(data, &st) != nil || st.MonitorPID <= 0 {
		return 0, 0, false
	}
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(st.MonitorPID), "smaps_rollup"))
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		v, _ := strconv.ParseFloat(fields[1], 64)
		switch fields[0] {
		case "Rss:":
			rss = v
		case "Pss:":
			pss = v
		}
	}
	return rss, pss, rss > 0
}

type benchDaemon struct {
	socket, state string
	cmd           *exec.Cmd
}

func newBenchDaemon(b *testing.B, dir string, extra ...string) *benchDaemon {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	d := &benchDaemon{socket: filepath.Join(dir, "s.sock"), state: filepath.Join(dir, "state")}
	parent := "fusiond-bench-" + filepath.Base(filepath.Dir(dir)) + "-" + filepath.Base(dir)
	cfg := "state_dir: " + d.state + "\nsocket: " + d.socket + "\nsocket_group: \"\"\ncgroup_parent: " + parent + "\nlog: {level: warn}\n" + strings.Join(extra, "")
	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, []byte(cfg), 0o644); err != nil {
		b.Fatal(err)
	}
	d.cmd = exec.Command(filepath.Join(binDir, "fusiond"), "--config", config)
	d.cmd.Stderr = os.Stderr
	if err := d.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		d.cmd.Process.Signal(os.Interrupt)
		d.cmd.Wait()
		tops, _ := filepath.Glob("/sys/fs/cgroup/*/" + parent)
		for _, top := range tops {
			var dirs []string
			filepath.WalkDir(top, func(p string, e os.DirEntry, err error) error {
				if err == nil && e.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			for i := len(dirs) - 1; i >= 0; i-- {
				os.Remove(dirs[i])
			}
		}
	})
	c := api.NewClient(d.socket)
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ready(context.Background()) != nil {
		if time.Now().After(deadline) {
			b.Fatal("bench daemon not ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return d
}

func waitState(b *testing.B, c *api.Client, id string, want api.State) api.Job {
	deadline := time.Now().Add(30 * time.Second)
	for {
		j, err := c.Get(context.Background(), id)
		if err != nil {
			b.Fatal(err)
		}
		if j.State == want || j.State.Terminal() {
			if j.State != want {
				b.Fatalf("job %s %s (%s), want %s", id, j.State, j.Reason, want)
			}
			return j
		}
		if time.Now().After(deadline) {
			b.Fatalf("job %s still %s", id, j.State)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitTerminal(b *testing.B, c *api.Client, id string) api.Job {
	deadline := time.Now().Add(30 * time.Second)
	for {
		j, err := c.Get(context.Background(), id)
		if err != nil {
			b.Fatal(err)
		}
		if j.State.Terminal() {
			return j
		}
		if time.Now().After(deadline) {
			b.Fatalf("job %s still %s", id, j.State)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
