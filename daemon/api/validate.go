package api

import (
	"errors"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Limits on a job spec; exported so docs and tests quote the same numbers.
const (
	MaxNameLen     = 63
	MaxPriority    = 1000
	MaxCommandSize = 128 << 10
	MaxEnv         = 256
	// ReservedEnvPrefix starts the variables fusiond sets in every job
	// (FUSIOND_JOB_ID, by which a job's processes are found without
	// cgroups, among them); a spec may not set any.
	ReservedEnvPrefix = "FUSIOND_"
	MaxLabels         = 64
	MaxGangSize       = 1024
	MaxRetries        = 100
	MaxGPUCount       = 64
	MinMemory         = Bytes(1 << 20)
	MaxCPU            = MilliCPU(1 << 30)
	// MinJobRuntime and MaxJobRuntime are the shortest and longest
	// max_runtime a spec may give (0 is no limit): the limit is checked
	// about once a second, so a shorter one would only kill a job at once.
	MinJobRuntime = Duration(time.Second)
	MaxJobRuntime = Duration(366 * 24 * time.Hour)
)

var (
	nameRE    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	envKeyRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	labelRE   = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?$`)
	migRE     = regexp.MustCompile(`^[1-8]g\.[0-9]+gb(\+me|-me|\+gfx|\+me\.all)?$`)
	refNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:+-]*$`)
	// podDeviceRE is a device plugin's device ID: a GPU or MIG UUID, a
	// "<uuid>:<profile>:<slot>" or "<uuid>:share:<i>", an FPGA region
	// ("dfl/0000:3b:00.0/0").
	podDeviceRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:+/-]*$`)
)

func oneOf[T ~string](v T, valid []T) bool { return slices.Contains(valid, v) }

func list[T ~string](valid []T) string {
	s := make([]string, len(valid))
	for i, v := range valid {
		s[i] = string(v)
	}
	return strings.Join(s, ", ")
}

// ApplyDefaults fills in the fields a user may leave out: the name (from the
// command), the class (batch), the GPU count (1 when a GPU block is given),
// the topology policy (best-effort) and the restart policy (never; none
// for a pod's device hold). The
// tier default depends on configuration and is left to the daemon.
func (s *JobSpec) ApplyDefaults() {
	if s.Name == "" && len(s.Command) > 0 {
		base := path.Base(s.Command[0])
		base = strings.TrimLeft(base, "._-")
		if len(base) > MaxNameLen {
			base = base[:MaxNameLen]
		}
		if nameRE.MatchString(base) {
			s.Name = base
		} else {
			s.Name = "job"
		}
	}
	if s.Class == "" {
		s.Class = ClassBatch
	}
	if s.Topology == "" {
		s.Topology = TopologyBestEffort
	}
	if g := s.Resources.GPU; g != nil && g.Count == 0 {
		g.Count = 1
	}
	if s.Restart == nil && s.Pod == nil { // a pod's hold runs nothing to restart
		s.Restart = &Restart{Policy: RestartNever}
	}
}

// Validate checks a spec (after ApplyDefaults) and returns the first problem
// as an *Error naming the field, or nil.
func (s *JobSpec) Validate() error {
	if s.Pod != nil {
		return s.validatePod()
	}
	if err := validateCommand(s.Command); err != nil {
		return err
	}
	if s.Name == "" {
		return FieldError("name", "required")
	}
	if len(s.Name) > MaxNameLen || !nameRE.MatchString(s.Name) {
		return FieldError("name", "must be 1-%d characters of letters, digits, '.', '_' or '-', starting with a letter or digit", MaxNameLen)
	}
	if !oneOf(s.Class, Classes) {
		return FieldError("class", "unknown class %q (want one of: %s)", s.Class, list(Classes))
	}
	if s.Tier != "" && !oneOf(s.Tier, Tiers) {
		return FieldError("tier", "unknown tier %q (want one of: %s)", s.Tier, list(Tiers))
	}
	if s.Priority < 0 || s.Priority > MaxPriority {
		return FieldError("priority", "must be between 0 and %d, got %d", MaxPriority, s.Priority)
	}
	if len(s.Env) > MaxEnv {
		return FieldError("env", "at most %d variables, got %d", MaxEnv, len(s.Env))
	}
	for _, k := range sortedKeys(s.Env) {
		if !envKeyRE.MatchString(k) {
			return FieldError("env."+k, "invalid variable name (want letters, digits and '_', not starting with a digit)")
		}
		if strings.HasPrefix(k, ReservedEnvPrefix) {
			return FieldError("env."+k, "variables starting with %s are set by fusiond and may not be given", ReservedEnvPrefix)
		}
		if strings.ContainsRune(s.Env[k], 0) {
			return FieldError("env."+k, "value contains a NUL byte")
		}
	}
	if s.Rootfs != "" && (!path.IsAbs(s.Rootfs) || path.Clean(s.Rootfs) != s.Rootfs || s.Rootfs == "/" || strings.ContainsRune(s.Rootfs, 0)) {
		return FieldError("rootfs", "must be the clean absolute path of a root filesystem other than /, got %q", s.Rootfs)
	}
	if s.Workdir != "" && (!path.IsAbs(s.Workdir) || strings.ContainsRune(s.Workdir, 0)) {
		return FieldError("workdir", "must be an absolute path, got %q", s.Workdir)
	}
	if err := s.Resources.validate(); err != nil {
		return err
	}
	if err := s.validateReplicas(); err != nil {
		return err
	}
	if s.QoS != nil {
		if err := s.QoS.Validate("qos"); err != nil {
			return err
		}
	}
	if s.Topology != "" && !oneOf(s.Topology, TopologyPolicies) {
		return FieldError("topology", "unknown policy %q (want one of: %s)", s.Topology, list(TopologyPolicies))
	}
	if g := s.Gang; g != nil {
		if g.Name == "" || len(g.Name) > MaxNameLen || !nameRE.MatchString(g.Name) {
			return FieldError("gang.name", "required: 1-%d characters of letters, digits, '.', '_' or '-'", MaxNameLen)
		}
		if g.Size < 1 || g.Size > MaxGangSize {
			return FieldError("gang.size", "must be between 1 and %d, got %d", MaxGangSize, g.Size)
		}
	}
	if r := s.Restart; r != nil {
		if !oneOf(r.Policy, RestartPolicies) {
			return FieldError("restart.policy", "unknown policy %q (want one of: %s)", r.Policy, list(RestartPolicies))
		}
		if r.MaxRetries < 0 || r.MaxRetries > MaxRetries {
			return FieldError("restart.max_retries", "must be between 0 and %d, got %d", MaxRetries, r.MaxRetries)
		}
		if r.Policy == RestartNever && r.MaxRetries != 0 {
			return FieldError("restart.max_retries", "only meaningful with policy on-failure")
		}
		if r.Policy == RestartOnFailure && s.Gang != nil {
			return FieldError("restart.policy", "a gang member cannot restart on its own: its gang is placed all together or not at all")
		}
	}
	if s.MaxRuntime != 0 && s.MaxRuntime < MinJobRuntime {
		return FieldError("max_runtime", "must be 0 (no limit) or at least %s (the limit is checked about once a second), got %s", MinJobRuntime, s.MaxRuntime)
	}
	if s.MaxRuntime > MaxJobRuntime {
		return FieldError("max_runtime", "must be at most %s (366 days), got %s", MaxJobRuntime, s.MaxRuntime)
	}
	if s.Movable && s.Gang != nil {
		return FieldError("movable", "a gang member cannot be moved on its own: its gang is placed all together or not at all")
	}
	if len(s.Labels) > MaxLabels {
		return FieldError("labels", "at most %d labels, got %d", MaxLabels, len(s.Labels))
	}
	for _, k := range sortedKeys(s.Labels) {
		if len(k) > MaxNameLen || !labelRE.MatchString(k) {
			return FieldError("labels."+k, "invalid label key")
		}
		if len(s.Labels[k]) > 256 || strings.ContainsRune(s.Labels[k], 0) {
			return FieldError("labels."+k, "value longer than 256 bytes or contains a NUL byte")
		}
	}
	return nil
}

func validateCommand(cmd []string) error {
	if len(cmd) == 0 || cmd[0] == "" {
		return FieldError("command", "required: the program to run and its arguments")
	}
	size := 0
	for i, a := range cmd {
		if strings.ContainsRune(a, 0) {
			return FieldError("command["+strconv.Itoa(i)+"]", "contains a NUL byte")
		}
		size += len(a) + 1
	}
	if size > MaxCommandSize {
		return FieldError("command", "longer than %d bytes", MaxCommandSize)
	}
	return nil
}

func (r *Resources) validate() error {
	if err := r.validateAmounts(); err != nil {
		return err
	}
	return r.validateDevices()
}

// validateAmounts checks the CPU and memory a job asks for.
func (r *Resources) validateAmounts() error {
	switch {
	case r.CPU == 0:
		return FieldError("resources.cpu", "required: CPU in cores (2, 0.5) or millicores (\"500m\")")
	case r.CPU < 0:
		return FieldError("resources.cpu", "must be positive, got %s", r.CPU)
	case r.CPU > MaxCPU:
		return FieldError("resources.cpu", "%s is more CPU than any host has", r.CPU)
	case r.Memory == 0:
		return FieldError("resources.memory", "required: memory with a unit (\"512Mi\", \"4Gi\")")
	case r.Memory < 0:
		return FieldError("resources.memory", "must be positive, got %d", r.Memory)
	case r.Memory < MinMemory:
		return FieldError("resources.memory", "at least %s, got %s", MinMemory, r.Memory)
	}
	return nil
}

// validateDevices checks the GPUs and FPGA a job asks for.
func (r *Resources) validateDevices() error {
	if g := r.GPU; g != nil {
		switch {
		case g.Count < 0 || g.Count > MaxGPUCount:
			return FieldError("resources.gpu.count", "must be between 1 and %d, got %d", MaxGPUCount, g.Count)
		case g.Share < 0 || g.Share >= 1000:
			return FieldError("resources.gpu.share", "a share is 1..999 milli-GPU (ask for count: 1 for a whole GPU), got %d", g.Share)
		case g.Share > 0 && g.MIG != "":
			return FieldError("resources.gpu.share", "share and mig are exclusive: ask for a MIG slice or a share of a GPU")
		case g.Share > 0 && g.Count != 1:
			return FieldError("resources.gpu.count", "a GPU share is a fraction of one GPU: count must be 1, got %d", g.Count)
		case g.MIG != "" && !migRE.MatchString(g.MIG):
			return FieldError("resources.gpu.mig", "%q is not a MIG profile name (like 1g.10gb, 3g.40gb, 1g.18gb+me)", g.MIG)
		case g.Memory < 0:
			return FieldError("resources.gpu.memory", "must be positive, got %d", g.Memory)
		case len(g.Model) > 64 || strings.ContainsRune(g.Model, 0):
			return FieldError("resources.gpu.model", "at most 64 characters")
		}
	}
	if f := r.FPGA; f != nil {
		if f.Bitstream == "" || len(f.Bitstream) > 128 || !refNameRE.MatchString(f.Bitstream) {
			return FieldError("resources.fpga.bitstream", "required: a bitstream name or ID from the library (fusionctl fpga bitstream list)")
		}
	}
	return nil
}

// MaxPodDevices is the most device IDs one pod's device hold names.
const MaxPodDevices = 64

// validatePod checks a pod's device hold (Spec.Pod): what kubelet
// allocated to one container through the device plugin. It runs no
// process here, and the pod's CPU and memory are kubelet's, so only its
// name, class, tier and devices are checked.
func (s *JobSpec) validatePod() error {
	p := s.Pod
	switch {
	case len(s.Command) > 0 || len(s.Env) > 0 || s.Rootfs != "" || s.Workdir != "" || s.Gang != nil || s.Restart != nil || s.Replicas != nil || s.QoS != nil:
		return FieldError("pod", "a pod's device hold runs no process: command, env, rootfs, workdir, gang, restart, replicas and qos must be empty")
	case s.MaxRuntime != 0:
		return FieldError("max_runtime", "a pod's device hold runs no process of fusiond's: it ends when kubelet frees its devices, so it has no max_runtime")
	case s.Movable:
		return FieldError("movable", "a pod's device hold is kubelet's: the daemon cannot stop and restart its pod, so it cannot be movable")
	case s.Resources.CPU != 0 || s.Resources.Memory != 0:
		return FieldError("pod", "a pod's CPU and memory are kubelet's: resources.cpu and resources.memory must be empty")
	case s.Name == "" || len(s.Name) > MaxNameLen || !nameRE.MatchString(s.Name):
		return FieldError("name", "must be 1-%d characters of letters, digits, '.', '_' or '-', starting with a letter or digit", MaxNameLen)
	case !oneOf(s.Class, Classes):
		return FieldError("class", "unknown class %q (want one of: %s)", s.Class, list(Classes))
	case s.Tier != "" && !oneOf(s.Tier, Tiers):
		return FieldError("tier", "unknown tier %q (want one of: %s)", s.Tier, list(Tiers))
	case p.Resource == "" || len(p.Resource) > 253 || !labelRE.MatchString(p.Resource):
		return FieldError("pod.resource", "required: an extended resource name such as fusiond.io/gpu-h200")
	case len(p.Devices) == 0 || len(p.Devices) > MaxPodDevices:
		return FieldError("pod.devices", "between 1 and %d device IDs, got %d", MaxPodDevices, len(p.Devices))
	}
	seen := make(map[string]bool, len(p.Devices))
	for i, id := range p.Devices {
		if id == "" || len(id) > 256 || !podDeviceRE.MatchString(id) {
			return FieldError("pod.devices["+strconv.Itoa(i)+"]", "not a device ID of the plugin")
		}
		if seen[id] {
			return FieldError("pod.devices["+strconv.Itoa(i)+"]", "device %q named twice", id)
		}
		seen[id] = true
	}
	if s.Resources.GPU == nil && s.Resources.FPGA == nil {
		return FieldError("pod.resource", "a pod's device hold holds a GPU, a MIG instance, a GPU share or an FPGA region")
	}
	return s.Resources.validateDevices()
}

// DecodeSpec strictly decodes a JSON job spec, applies defaults and
// validates it. Every error is an *Error naming the field.
func DecodeSpec(data []byte) (JobSpec, error) {
	var s JobSpec
	if err := DecodeStrict(data, &s); err != nil {
		return JobSpec{}, err
	}
	s.ApplyDefaults()
	if err := s.Validate(); err != nil {
		return JobSpec{}, err
	}
	return s, nil
}

// MaxBatch is the most job specs one POST /v1/batches may carry.
const MaxBatch = 1000

// DecodeBatch strictly decodes a BatchRequest and each of its specs (as
// DecodeSpec does); an error about one spec names it ("jobs[1].name").
func DecodeBatch(data []byte) ([]JobSpec, error) {
	var req BatchRequest
	if err := DecodeStrict(data, &req); err != nil {
		return nil, err
	}
	switch {
	case len(req.Jobs) == 0:
		return nil, FieldError("jobs", "required: at least one job spec")
	case len(req.Jobs) > MaxBatch:
		return nil, FieldError("jobs", "at most %d job specs in one request, got %d", MaxBatch, len(req.Jobs))
	}
	specs := make([]JobSpec, len(req.Jobs))
	for i, raw := range req.Jobs {
		s, err := DecodeSpec(raw)
		if err != nil {
			var e *Error
			if errors.As(err, &e) {
				out := *e
				out.Field = "jobs[" + strconv.Itoa(i) + "]"
				if e.Field != "" {
					out.Field += "." + e.Field
				}
				return nil, &out
			}
			return nil, err
		}
		specs[i] = s
	}
	return specs, nil
}

// Bounds of a QoS SLO.
const (
	MinRunqueueP99 = Duration(10 * time.Microsecond)
	MaxRunqueueP99 = Duration(10 * time.Second)
)

// Validate checks a QoS SLO; prefix names its field ("qos").
func (q *QoS) Validate(prefix string) error {
	if q.RunqueueP99 != 0 && (q.RunqueueP99 < MinRunqueueP99 || q.RunqueueP99 > MaxRunqueueP99) {
		return FieldError(prefix+".runqueue_p99", "must be between %v and %v, got %v", MinRunqueueP99, MaxRunqueueP99, q.RunqueueP99)
	}
	if q.PSISomeAvg10 < 0 || q.PSISomeAvg10 > 100 {
		return FieldError(prefix+".psi_some_avg10", "must be a percentage in (0, 100], got %g", q.PSISomeAvg10)
	}
	if q.RunqueueP99 == 0 && q.PSISomeAvg10 == 0 {
		return FieldError(prefix, "set runqueue_p99 or psi_some_avg10 (or leave qos out for the class default)")
	}
	return nil
}
