package nvidia

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"sigs.k8s.io/yaml"
)

// Sentinel errors of GPU sharing.
var (
	// ErrShareExceeded means admitting the share would oversubscribe the
	// GPU's compute or memory, or its configured replicas.
	ErrShareExceeded = errors.New("nvidia: GPU share exceeds what is left on the device")
	// ErrShareUser means the share's user is not the user an MPS GPU
	// serves: an MPS GPU serves one user's shares at a time (the control
	// daemon runs one server per user, and a second user's clients would
	// wait for the first user's server to exit).
	ErrShareUser = errors.New("nvidia: MPS GPU serves another user")
	// ErrSharingConfig marks an invalid sharing configuration.
	ErrSharingConfig = errors.New("nvidia: invalid sharing config")
)

// ShareMode is how a shared GPU's limits are enforced.
type ShareMode string

const (
	// ModeMPS enforces compute share and memory cap through CUDA MPS.
	ModeMPS ShareMode = "mps"
	// ModeTimeSlicing shares by plain time-slicing: no memory or fault
	// isolation: the compute share is admission bookkeeping, the memory
	// cap is watched (TimeSlicedShareMemory; the daemon's gpu-memcap part
	// warns or stops a job over it).
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
	// MemoryMB is the device-memory cap; 0 is no cap.
	MemoryMB uint64 `json:"memoryMB"`
	// UID and GID are the user the share's processes run as: an MPS GPU
	// serves one UID at a time and its pipe and log directories are
	// owned by UID:GID while it does.
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
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
	// op serialises admissions and releases on the GPU, so that the MPS
	// daemon is started, limited and stopped in the order the shares
	// were counted. Taken before Manager.mu, never while holding it.
	op       sync.Mutex
	mode     ShareMode
	replicas int
	shares   map[string]Share
}

// MPSOwner is the user a GPU's MPS server runs as.
type MPSOwner struct {
	UID, GID uint32
}

// MPSLimits are the limits fusiond sets on a GPU's MPS server through the
// control pipe: the sum of the shares of the user the GPU serves.
type MPSLimits struct {
	// ThreadPercentage is the active-thread percentage, 1..100.
	ThreadPercentage int
	// PinnedMemMB is the device-memory limit of each client, in MiB.
	PinnedMemMB uint64
}

// MPSControl runs the CUDA MPS control daemon of one GPU and sets the
// limits of its server.
type MPSControl interface {
	// Available reports whether MPS can be used on this host.
	Available() bool
	// Start gives the GPU's pipe and log directories to owner (mode
	// 0700) and runs the control daemon for the GPU (idempotent).
	Start(ctx context.Context, gpuUUID string, owner MPSOwner) error
	// SetLimits writes the limits through the control pipe: the defaults
	// for a server still to start and, for each running server, the
	// per-server limits.
	SetLimits(ctx context.Context, gpuUUID string, lim MPSLimits) error
	// Stop asks the GPU's control daemon to quit and gives the
	// directories back to root (idempotent).
	Stop(ctx context.Context, gpuUUID string) error
	// Dirs are the pipe and log directories clients of the GPU must use.
	Dirs(gpuUUID string) (pipe, log string)
}

// Runner runs a command with extra environment and stdin and returns what
// it wrote to stdout.
type Runner func(ctx context.Context, env []string, stdin string, name string, args ...string) (string, error)

// ExecRunner runs commands with os/exec.
func ExecRunner(ctx context.Context, env []string, stdin string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %v: %w: %s", name, args, err, strings.TrimSpace(out.String()+" "+errOut.String()))
	}
	return out.String(), nil
}

// MPSDaemon controls nvidia-cuda-mps-control, one daemon per GPU with its
// own pipe and log directory under Root. Commands reach the daemon through
// the control program's stdin, one invocation per command, as in
// "echo quit | nvidia-cuda-mps-control".
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

func (d *MPSDaemon) running(gpu string) bool {
	pipe, _ := d.Dirs(gpu)
	_, err := os.Stat(filepath.Join(pipe, "control"))
	return err == nil
}

// command sends one command line to the GPU's control daemon.
func (d *MPSDaemon) command(ctx context.Context, gpu, line string) (string, error) {
	out, err := d.runner()(ctx, d.env(gpu), line+"\n", d.binary())
	if err != nil {
		return out, fmt.Errorf("mps %s: %q: %w", gpu, line, err)
	}
	return out, nil
}

// Start implements MPSControl. The GPU directory (<root>/<gpu>) stays
// root's, mode 0755; its pipe and log directories are owner's, mode 0700,
// so only owner and root reach them. A log left by an earlier daemon is
// kept as log.prev, root's, mode 0700.
func (d *MPSDaemon) Start(ctx context.Context, gpu string, owner MPSOwner) error {
	if gpu == "" || strings.ContainsAny(gpu, "/\x00") || gpu == "." || gpu == ".." {
		return fmt.Errorf("mps: GPU %q is not a UUID: %w", gpu, ErrUnknownDevice)
	}
	pipe, log := d.Dirs(gpu)
	base := filepath.Dir(pipe)
	if err := os.MkdirAll(base, 0o755); err != nil {
		return fmt.Errorf("mps %s: %w", gpu, err)
	}
	running := d.running(gpu)
	if !running {
		if err := rotateLog(log); err != nil {
			return fmt.Errorf("mps %s: %w", gpu, err)
		}
	}
	for _, dir := range []string{pipe, log} {
		if err := ownDir(dir, int(owner.UID), int(owner.GID)); err != nil {
			return fmt.Errorf("mps %s: %w", gpu, err)
		}
	}
	if running {
		return nil
	}
	_, err := d.runner()(ctx, d.env(gpu), "", d.binary(), "-d")
	if err != nil {
		return fmt.Errorf("mps %s: start control daemon: %w", gpu, err)
	}
	return nil
}

// SetLimits implements MPSControl. The device index is 0: the daemon is
// started with CUDA_VISIBLE_DEVICES set to the one GPU, so that is the
// only device its servers and clients see.
func (d *MPSDaemon) SetLimits(ctx context.Context, gpu string, lim MPSLimits) error {
	if lim.ThreadPercentage < 1 || lim.ThreadPercentage > 100 || lim.PinnedMemMB == 0 {
		return fmt.Errorf("mps %s: limits %+v: want 1..100 percent and a memory limit: %w", gpu, lim, ErrShareExceeded)
	}
	pct := strconv.Itoa(lim.ThreadPercentage)
	mem := fmt.Sprintf("%dM", lim.PinnedMemMB)
	for _, line := range []string{
		"set_default_active_thread_percentage " + pct,
		"set_default_device_pinned_mem_limit 0 " + mem,
	} {
		if _, err := d.command(ctx, gpu, line); err != nil {
			return err
		}
	}
	out, err := d.command(ctx, gpu, "get_server_list")
	if err != nil {
		return err
	}
	pids, err := parseServerList(out)
	if err != nil {
		return fmt.Errorf("mps %s: get_server_list: %w", gpu, err)
	}
	for _, pid := range pids {
		for _, line := range []string{
			"set_active_thread_percentage " + pid + " " + pct,
			"set_device_pinned_mem_limit " + pid + " 0 " + mem,
		} {
			if _, err := d.command(ctx, gpu, line); err != nil {
				return err
			}
		}
	}
	return nil
}

// parseServerList reads get_server_list's answer: one server PID a line.
func parseServerList(out string) ([]string, error) {
	var pids []string
	for _, f := range strings.Fields(out) {
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a server PID", f)
		}
		pids = append(pids, strconv.Itoa(n))
	}
	return pids, nil
}

// Stop implements MPSControl.
func (d *MPSDaemon) Stop(ctx context.Context, gpu string) error {
	var err error
	if d.running(gpu) {
		_, err = d.command(ctx, gpu, "quit")
	}
	pipe, log := d.Dirs(gpu)
	for _, dir := range []string{pipe, log} {
		if _, serr := os.Stat(dir); serr == nil {
			err = errors.Join(err, ownTree(dir, 0, 0))
		}
	}
	if err != nil {
		return fmt.Errorf("mps %s: stop: %w", gpu, err)
	}
	return nil
}

// ownDir creates dir if needed and makes it uid:gid's, mode 0700.
func ownDir(dir string, uid, gid int) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if err := os.Lchown(dir, uid, gid); err != nil {
		return err
	}
	return os.Chmod(dir, 0o700)
}

// ownTree gives dir and everything in it to uid:gid and sets dir's mode
// to 0700 (links are changed, not followed).
func ownTree(dir string, uid, gid int) error {
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
	if err != nil {
		return err
	}
	return os.Chmod(dir, 0o700)
}

// rotateLog moves a non-empty log directory to log.prev (replacing an
// older one), root's and mode 0700, so a new user never reads an earlier
// user's server log.
func rotateLog(log string) error {
	ents, err := os.ReadDir(log)
	if errors.Is(err, os.ErrNotExist) || (err == nil && len(ents) == 0) {
		return nil
	}
	if err != nil {
		return err
	}
	prev := log + ".prev"
	if err := os.RemoveAll(prev); err != nil {
		return err
	}
	if err := os.Rename(log, prev); err != nil {
		return err
	}
	return ownTree(prev, 0, 0)
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
// on its GPU stay within the device. In MPS mode a GPU serves one user at
// a time: a share of another user than the one its shares belong to is
// refused (ErrShareUser); the first share starts the GPU's control daemon
// with the pipe and log directories given to the share's user, and every
// admission sets the server's limits through the control pipe to the sum
// of the shares (see mpsLimits). Admitting the same share again is a
// no-op; on error nothing stays admitted.
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
	m.mu.Unlock()
	st.op.Lock()
	defer st.op.Unlock()

	m.mu.Lock()
	if old, ok := st.shares[s.ID]; ok && old == s {
		m.mu.Unlock()
		return nil
	}
	milli, mem := s.Milli, s.MemoryMB
	var other *Share
	for id, o := range st.shares {
		if id != s.ID {
			milli += o.Milli
			mem += o.MemoryMB
			if o.UID != s.UID && other == nil {
				other = &o
			}
		}
	}
	old, replace := st.shares[s.ID]
	switch {
	case st.mode == ModeMPS && other != nil:
		err = fmt.Errorf("share %s: uid %d: GPU %s is in MPS mode and serves uid %d (share %s): %w", s.ID, s.UID, s.GPU, other.UID, other.ID, ErrShareUser)
	case milli > MilliGPU:
		err = fmt.Errorf("share %s: compute %d of %d milli-GPU: %w", s.ID, milli, MilliGPU, ErrShareExceeded)
	case mem > g.MemoryMB:
		err = fmt.Errorf("share %s: memory %d of %d MiB: %w", s.ID, mem, g.MemoryMB, ErrShareExceeded)
	case st.replicas > 0 && !replace && len(st.shares)+1 > st.replicas:
		err = fmt.Errorf("share %s: %d replicas configured: %w", s.ID, st.replicas, ErrShareExceeded)
	}
	first := len(st.shares) == 0 || (replace && len(st.shares) == 1)
	mode := st.mode
	if err == nil {
		st.shares[s.ID] = s
	}
	lim := mpsLimits(st.shares, g.MemoryMB)
	m.mu.Unlock()
	if err != nil || mode != ModeMPS {
		return err
	}
	undo := func() {
		m.mu.Lock()
		if replace {
			st.shares[s.ID] = old
		} else {
			delete(st.shares, s.ID)
		}
		m.mu.Unlock()
	}
	if first {
		if err := m.mps.Start(ctx, s.GPU, MPSOwner{UID: s.UID, GID: s.GID}); err != nil {
			undo()
			return fmt.Errorf("share %s: start MPS: %w", s.ID, err)
		}
	}
	if err := m.mps.SetLimits(ctx, s.GPU, lim); err != nil {
		undo()
		if first && !replace {
			if serr := m.mps.Stop(ctx, s.GPU); serr != nil {
				m.log.Warn("nvidia: stopping MPS after failed limits", "gpu", s.GPU, "err", serr)
			}
		}
		return fmt.Errorf("share %s: MPS limits: %w", s.ID, err)
	}
	m.log.Info("nvidia: MPS limits set through the control pipe", "gpu", s.GPU, "uid", s.UID,
		"active_thread_percentage", lim.ThreadPercentage, "pinned_mem_mb", lim.PinnedMemMB, "shares", len(st.shares))
	return nil
}

// mpsLimits are the limits of the MPS server of the user a GPU serves: the
// active-thread percentage of the sum of its shares (rounded up, at most
// 100) and the sum of their memory caps, or all of the GPU's memory when
// any share has no cap. Caller holds m.mu.
func mpsLimits(shares map[string]Share, gpuMemMB uint64) MPSLimits {
	milli, mem, capped := 0, uint64(0), true
	for _, s := range shares {
		milli += s.Milli
		mem += s.MemoryMB
		capped = capped && s.MemoryMB > 0
	}
	if !capped || mem > gpuMemMB {
		mem = gpuMemMB
	}
	return MPSLimits{ThreadPercentage: min(percentOf(milli), 100), PinnedMemMB: mem}
}

// percentOf is a compute share in whole percent, rounded up.
func percentOf(milli int) int { return (milli + 9) / 10 }

// ReleaseShare removes a share; the last one stops the GPU's MPS daemon
// (which gives its directories back to root), any other lowers the
// server's limits to the shares left.
func (m *Manager) ReleaseShare(ctx context.Context, gpu, id string) error {
	m.mu.Lock()
	st, ok := m.shares[gpu]
	m.mu.Unlock()
	if !ok {
		return nil
	}
	g, _, gerr := m.gpu(gpu)
	st.op.Lock()
	defer st.op.Unlock()
	m.mu.Lock()
	_, had := st.shares[id]
	delete(st.shares, id)
	left := len(st.shares)
	mode := st.mode
	lim := mpsLimits(st.shares, g.MemoryMB)
	m.mu.Unlock()
	if !had || mode != ModeMPS {
		return nil
	}
	if left == 0 {
		return m.mps.Stop(ctx, gpu)
	}
	if gerr != nil {
		return fmt.Errorf("share %s released: %w", id, gerr)
	}
	if err := m.mps.SetLimits(ctx, gpu, lim); err != nil {
		return fmt.Errorf("share %s released: MPS limits: %w", id, err)
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
	env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = strconv.Itoa(percentOf(got.Milli))
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
