package nvidia

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// Sentinel errors of GPU sharing.
var (
	// ErrShareExceeded means admitting the share would oversubscribe the
	// GPU's compute or memory, or its configured replicas.
	ErrShareExceeded = errors.New("nvidia: GPU share exceeds what is left on the device")
	// ErrSharingConfig marks an invalid sharing configuration.
	ErrSharingConfig = errors.New("nvidia: invalid sharing config")
)

// ShareMode is how a shared GPU's limits are enforced.
type ShareMode string

const (
	// ModeMPS enforces compute share and memory cap through CUDA MPS.
	ModeMPS ShareMode = "mps"
	// ModeTimeSlicing shares by plain time-slicing: no memory or fault
	// isolation; caps are admission bookkeeping only.
	ModeTimeSlicing ShareMode = "time-slicing"
)

// MilliGPU is a whole GPU in compute-share units.
const MilliGPU = 1000

// Share is one job's slice of a shared GPU.
type Share struct {
	// ID names the allocation.
	ID string `json:"id"`
	// GPU is the GPU UUID.
	GPU string `json:"gpu"`
	// Milli is the compute share, 1..1000.
	Milli int `json:"milli"`
	// MemoryMB is the device-memory cap.
	MemoryMB uint64 `json:"memoryMB"`
}

// ShareStatus is the sharing state of one GPU, for status output.
type ShareStatus struct {
	GPU       string    `json:"gpu"`
	Mode      ShareMode `json:"mode"`
	Replicas  int       `json:"replicas,omitempty"`
	UsedMilli int       `json:"usedMilli"`
	UsedMemMB uint64    `json:"usedMemoryMB"`
	Shares    []Share   `json:"shares,omitempty"`
}

type shareState struct {
	mode     ShareMode
	replicas int
	shares   map[string]Share
}

// MPSControl starts and stops the CUDA MPS control daemon of one GPU.
type MPSControl interface {
	// Available reports whether MPS can be used on this host.
	Available() bool
	// Start runs the control daemon for the GPU (idempotent).
	Start(ctx context.Context, gpuUUID string) error
	// Stop asks the GPU's control daemon to quit (idempotent).
	Stop(ctx context.Context, gpuUUID string) error
	// Dirs are the pipe and log directories clients of the GPU must use.
	Dirs(gpuUUID string) (pipe, log string)
}

// Runner runs a command with extra environment and stdin.
type Runner func(ctx context.Context, env []string, stdin string, name string, args ...string) error

// ExecRunner runs commands with os/exec.
func ExecRunner(ctx context.Context, env []string, stdin string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %v: %w: %s", name, args, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// MPSDaemon controls nvidia-cuda-mps-control, one daemon per GPU with its
// own pipe and log directory under Root.
type MPSDaemon struct {
	// Root holds <gpu-uuid>/pipe and <gpu-uuid>/log (e.g. /run/fusiond/mps).
	Root string
	// Binary is the control program (default nvidia-cuda-mps-control).
	Binary string
	// Run executes commands (default ExecRunner).
	Run Runner
}

var _ MPSControl = (*MPSDaemon)(nil)

func (d *MPSDaemon) binary() string {
	if d.Binary != "" {
		return d.Binary
	}
	return "nvidia-cuda-mps-control"
}

func (d *MPSDaemon) runner() Runner {
	if d.Run != nil {
		return d.Run
	}
	return ExecRunner
}

// Available implements MPSControl: the control binary is on PATH.
func (d *MPSDaemon) Available() bool {
	_, err := exec.LookPath(d.binary())
	return err == nil
}

// Dirs implements MPSControl.
func (d *MPSDaemon) Dirs(gpu string) (string, string) {
	return filepath.Join(d.Root, gpu, "pipe"), filepath.Join(d.Root, gpu, "log")
}

func (d *MPSDaemon) env(gpu string) []string {
	pipe, log := d.Dirs(gpu)
	return []string{"CUDA_VISIBLE_DEVICES=" + gpu, "CUDA_MPS_PIPE_DIRECTORY=" + pipe, "CUDA_MPS_LOG_DIRECTORY=" + log}
}

// Start implements MPSControl.
func (d *MPSDaemon) Start(ctx context.Context, gpu string) error {
	pipe, log := d.Dirs(gpu)
	for _, dir := range []string{pipe, log} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("mps %s: %w", gpu, err)
		}
	}
	if _, err := os.Stat(filepath.Join(pipe, "control")); err == nil {
		return nil // already running
	}
	return d.runner()(ctx, d.env(gpu), "", d.binary(), "-d")
}

// Stop implements MPSControl.
func (d *MPSDaemon) Stop(ctx context.Context, gpu string) error {
	pipe, _ := d.Dirs(gpu)
	if _, err := os.Stat(filepath.Join(pipe, "control")); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return d.runner()(ctx, d.env(gpu), "quit\n", d.binary())
}

// SetReplicas limits the number of shares on a GPU (from the device
// plugin's timeSlicing config); 0 means no limit beyond compute and memory.
func (m *Manager) SetReplicas(gpu string, replicas int) error {
	if _, _, err := m.gpu(gpu); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.shareOf(gpu).replicas = replicas
	return nil
}

func (m *Manager) shareOf(gpu string) *shareState {
	s, ok := m.shares[gpu]
	if !ok {
		s = &shareState{mode: ModeTimeSlicing, shares: map[string]Share{}}
		if m.mps != nil && m.mps.Available() {
			s.mode = ModeMPS
		}
		m.shares[gpu] = s
	}
	return s
}

// AdmitShare admits a share if the sums of compute shares and memory caps
// on its GPU stay within the device, and starts the GPU's MPS daemon for
// the first share in MPS mode. Admitting the same ID again is a no-op.
func (m *Manager) AdmitShare(ctx context.Context, s Share) error {
	g, _, err := m.gpu(s.GPU)
	if err != nil {
		return err
	}
	if s.Milli <= 0 || s.Milli > MilliGPU {
		return fmt.Errorf("share %s: compute %d milli-GPU out of 1..%d: %w", s.ID, s.Milli, MilliGPU, ErrShareExceeded)
	}
	if g.MIGEnabled {
		return fmt.Errorf("share %s: GPU %s is in MIG mode: %w", s.ID, s.GPU, ErrShareExceeded)
	}
	if !m.Healthy(s.GPU) {
		return fmt.Errorf("share %s: GPU %s: %w", s.ID, s.GPU, ErrUnhealthy)
	}
	m.mu.Lock()
	st := m.shareOf(s.GPU)
	if old, ok := st.shares[s.ID]; ok && old == s {
		m.mu.Unlock()
		return nil
	}
	milli, mem := s.Milli, s.MemoryMB
	for id, o := range st.shares {
		if id != s.ID {
			milli += o.Milli
			mem += o.MemoryMB
		}
	}
	_, replace := st.shares[s.ID]
	switch {
	case milli > MilliGPU:
		err = fmt.Errorf("share %s: compute %d of %d milli-GPU: %w", s.ID, milli, MilliGPU, ErrShareExceeded)
	case mem > g.MemoryMB:
		err = fmt.Errorf("share %s: memory %d of %d MiB: %w", s.ID, mem, g.MemoryMB, ErrShareExceeded)
	case st.replicas > 0 && !replace && len(st.shares)+1 > st.replicas:
		err = fmt.Errorf("share %s: %d replicas configured: %w", s.ID, st.replicas, ErrShareExceeded)
	}
	first := len(st.shares) == 0
	mode := st.mode
	if err == nil {
		st.shares[s.ID] = s
	}
	m.mu.Unlock()
	if err != nil {
		return err
	}
	if first && mode == ModeMPS {
		if err := m.mps.Start(ctx, s.GPU); err != nil {
			m.mu.Lock()
			delete(st.shares, s.ID)
			m.mu.Unlock()
			return fmt.Errorf("share %s: start MPS: %w", s.ID, err)
		}
	}
	return nil
}

// ReleaseShare removes a share; the last one stops the GPU's MPS daemon.
func (m *Manager) ReleaseShare(ctx context.Context, gpu, id string) error {
	m.mu.Lock()
	st, ok := m.shares[gpu]
	if !ok {
		m.mu.Unlock()
		return nil
	}
	_, had := st.shares[id]
	delete(st.shares, id)
	last := had && len(st.shares) == 0
	mode := st.mode
	m.mu.Unlock()
	if last && mode == ModeMPS {
		return m.mps.Stop(ctx, gpu)
	}
	return nil
}

// ShareStatuses reports every GPU's sharing mode and admitted shares.
func (m *Manager) ShareStatuses() []ShareStatus {
	gpus := m.GPUs()
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]ShareStatus, 0, len(gpus))
	for _, g := range gpus {
		st := m.shareOf(g.UUID)
		ss := ShareStatus{GPU: g.UUID, Mode: st.mode, Replicas: st.replicas}
		for _, s := range st.shares {
			ss.UsedMilli += s.Milli
			ss.UsedMemMB += s.MemoryMB
			ss.Shares = append(ss.Shares, s)
		}
		sort.Slice(ss.Shares, func(i, j int) bool { return ss.Shares[i].ID < ss.Shares[j].ID })
		out = append(out, ss)
	}
	return out
}

// shareEnv is the environment a share's client needs. In MPS mode it pins
// the active-thread percentage and device memory; the client sees its GPU
// as device 0.
func (m *Manager) shareEnv(s Share) (map[string]string, error) {
	m.mu.Lock()
	st := m.shareOf(s.GPU)
	got, ok := st.shares[s.ID]
	mode := st.mode
	m.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("share %s on %s: not admitted: %w", s.ID, s.GPU, ErrUnknownDevice)
	}
	env := map[string]string{}
	if mode != ModeMPS {
		return env, nil
	}
	pipe, log := m.mps.Dirs(s.GPU)
	env["CUDA_MPS_PIPE_DIRECTORY"] = pipe
	env["CUDA_MPS_LOG_DIRECTORY"] = log
	env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = strconv.Itoa((got.Milli + 9) / 10)
	if got.MemoryMB > 0 {
		env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = fmt.Sprintf("0=%dM", got.MemoryMB)
	}
	return env, nil
}

// SharingConfig is the NVIDIA device plugin's config file, of which fusiond
// reads the sharing section:
//
//	version: v1
//	sharing:
//	  timeSlicing:
//	    resources:
//	    - name: nvidia.com/gpu
//	      replicas: 4
type SharingConfig struct {
	Version string          `json:"version"`
	Flags   json.RawMessage `json:"flags,omitempty"`
	Sharing struct {
		TimeSlicing *SharingSection `json:"timeSlicing,omitempty"`
		MPS         *SharingSection `json:"mps,omitempty"`
	} `json:"sharing"`
}

// SharingSection is timeSlicing or mps.
type SharingSection struct {
	RenameByDefault            bool              `json:"renameByDefault,omitempty"`
	FailRequestsGreaterThanOne bool              `json:"failRequestsGreaterThanOne,omitempty"`
	Resources                  []ReplicaResource `json:"resources"`
}

// ReplicaResource says how many replicas each GPU of a resource offers.
type ReplicaResource struct {
	Name     string          `json:"name"`
	Rename   string          `json:"rename,omitempty"`
	Devices  json.RawMessage `json:"devices,omitempty"`
	Replicas int             `json:"replicas"`
}

// ParseSharingConfig decodes a device-plugin config strictly.
func ParseSharingConfig(data []byte) (*SharingConfig, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSharingConfig, err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	var c SharingConfig
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSharingConfig, err)
	}
	if c.Version != "v1" {
		return nil, fmt.Errorf("%w: version: got %q, want \"v1\"", ErrSharingConfig, c.Version)
	}
	for kind, sec := range map[string]*SharingSection{"timeSlicing": c.Sharing.TimeSlicing, "mps": c.Sharing.MPS} {
		if sec == nil {
			continue
		}
		for i, r := range sec.Resources {
			where := fmt.Sprintf("sharing.%s.resources[%d]", kind, i)
			if r.Name != "nvidia.com/gpu" && !strings.HasPrefix(r.Name, "nvidia.com/mig-") {
				return nil, fmt.Errorf("%w: %s.name: %q is not nvidia.com/gpu or nvidia.com/mig-<profile>", ErrSharingConfig, where, r.Name)
			}
			if r.Replicas < 1 {
				return nil, fmt.Errorf("%w: %s.replicas: %d, want at least 1", ErrSharingConfig, where, r.Replicas)
			}
			if _, err := r.selector(); err != nil {
				return nil, fmt.Errorf("%w: %s.devices: %w", ErrSharingConfig, where, err)
			}
		}
	}
	return &c, nil
}

// selector decodes devices: absent or "all", or a list of indices or UUIDs.
func (r ReplicaResource) selector() (func(GPU) bool, error) {
	if len(r.Devices) == 0 {
		return func(GPU) bool { return true }, nil
	}
	var s string
	if err := json.Unmarshal(r.Devices, &s); err == nil {
		if s != "all" {
			return nil, fmt.Errorf("%q is not \"all\" or a list", s)
		}
		return func(GPU) bool { return true }, nil
	}
	var list []any
	if err := json.Unmarshal(r.Devices, &list); err != nil {
		return nil, fmt.Errorf("want \"all\" or a list of indices or UUIDs: %w", err)
	}
	idx, uuids := map[int]bool{}, map[string]bool{}
	for _, v := range list {
		switch x := v.(type) {
		case float64:
			if x < 0 || x != float64(int(x)) {
				return nil, fmt.Errorf("%v is not a GPU index", x)
			}
			idx[int(x)] = true
		case string:
			uuids[x] = true
		default:
			return nil, fmt.Errorf("%v is not a GPU index or UUID", v)
		}
	}
	return func(g GPU) bool { return idx[g.Index] || uuids[g.UUID] }, nil
}

// ApplySharingConfig sets each GPU's replica count and enforcement mode
// from a device-plugin config: GPUs named in the mps section use MPS (when
// it is available, else time-slicing, logged), those in timeSlicing use
// time-slicing. GPUs holding shares keep their current mode.
func (m *Manager) ApplySharingConfig(c *SharingConfig) error {
	gpus := m.GPUs()
	apply := func(sec *SharingSection, mode ShareMode) {
		if sec == nil {
			return
		}
		one := &SharingConfig{}
		one.Sharing.TimeSlicing = sec
		for uuid, n := range one.Replicas(gpus) {
			m.mu.Lock()
			st := m.shareOf(uuid)
			st.replicas = n
			if len(st.shares) == 0 {
				st.mode = mode
				if mode == ModeMPS && (m.mps == nil || !m.mps.Available()) {
					st.mode = ModeTimeSlicing
					m.log.Warn("nvidia: MPS requested but not available; time-slicing", "gpu", uuid)
				}
			}
			m.mu.Unlock()
		}
	}
	apply(c.Sharing.TimeSlicing, ModeTimeSlicing)
	apply(c.Sharing.MPS, ModeMPS)
	return nil
}

// Replicas returns the whole-GPU replica count the time-slicing (or mps)
// section gives each GPU, by UUID.
func (c *SharingConfig) Replicas(gpus []GPU) map[string]int {
	out := map[string]int{}
	for _, sec := range []*SharingSection{c.Sharing.TimeSlicing, c.Sharing.MPS} {
		if sec == nil {
			continue
		}
		for _, r := range sec.Resources {
			if r.Name != "nvidia.com/gpu" {
				continue
			}
			sel, err := r.selector()
			if err != nil {
				continue
			}
			for _, g := range gpus {
				if sel(g) {
					out[g.UUID] = r.Replicas
				}
			}
		}
	}
	return out
}
