package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/deviceplugin"
	"github.com/fusiond/fusiond/daemon/internal/hardware"
	"github.com/fusiond/fusiond/daemon/internal/hostplacer"
	"github.com/fusiond/fusiond/daemon/internal/jobs"
	"github.com/fusiond/fusiond/devices"
)

// KubernetesConfig makes fusiond a kubelet device plugin (off by default;
// docs/kubernetes.md): kubelet's pods get this host's GPUs, MIG instances,
// GPU shares and FPGA regions from the same ledger as fusiond's jobs.
type KubernetesConfig struct {
	// DevicePlugin serves the devices to kubelet.
	DevicePlugin bool `json:"device_plugin"`
	// ResourcePrefix is the extended resources' domain
	// (fusiond.io/gpu-h200).
	ResourcePrefix string `json:"resource_prefix"`
	// ShareReplicas is how many device IDs each GPU offers as the shared
	// resource (<prefix>/gpu-<model>-shared): a pod asking for k of them
	// gets k/ShareReplicas of one GPU. 0: no shared resources.
	ShareReplicas int `json:"share_replicas"`
	// PluginDir is kubelet's device-plugin directory (kubelet.sock).
	PluginDir string `json:"plugin_dir"`
	// PodResourcesSocket is kubelet's pod-resources API.
	PodResourcesSocket string `json:"pod_resources_socket"`
	// ReconcileInterval is how often the holds are compared with the
	// pods kubelet reports; ReleaseGrace how long a hold may be missing
	// from them before its devices are given back.
	ReconcileInterval Duration `json:"reconcile_interval"`
	ReleaseGrace      Duration `json:"release_grace"`
	// FeaturesFile is node-feature-discovery's local features file; ""
	// writes none.
	FeaturesFile string `json:"features_file"`
	// MaxHolds caps the pods' device holds held at once (0: no limit).
	MaxHolds int `json:"max_holds"`
	// CDIKind, when set ("nvidia.com/gpu"), also names each GPU and MIG
	// instance to the runtime as a CDI device (<kind>=<UUID>), for
	// runtimes with CDI specs for them.
	CDIKind string `json:"cdi_kind,omitempty"`
}

// DefaultKubernetesConfig is the kubernetes section's defaults.
func DefaultKubernetesConfig() KubernetesConfig {
	return KubernetesConfig{
		ResourcePrefix:     hostplacer.DefaultPodPrefix,
		PluginDir:          "/var/lib/kubelet/device-plugins",
		PodResourcesSocket: "/var/lib/kubelet/pod-resources/kubelet.sock",
		ReconcileInterval:  Duration(10 * time.Second),
		ReleaseGrace:       Duration(time.Minute),
		FeaturesFile:       "/etc/kubernetes/node-feature-discovery/features.d/fusiond",
		MaxHolds:           1024,
	}
}

func (k KubernetesConfig) validate() (string, error) {
	if err := deviceplugin.CheckPrefix(k.ResourcePrefix); err != nil {
		return "kubernetes.resource_prefix", err
	}
	if k.CDIKind != "" {
		if err := deviceplugin.CheckCDIKind(k.CDIKind); err != nil {
			return "kubernetes.cdi_kind", err
		}
	}
	switch {
	case k.ShareReplicas < 0 || k.ShareReplicas > 1000:
		return "kubernetes.share_replicas", fmt.Errorf("between 0 (no shared resources) and 1000, got %d", k.ShareReplicas)
	case k.ShareReplicas == 1:
		return "kubernetes.share_replicas", errors.New("1 replica is a whole GPU: use 0 (no shared resources) or 2 and more")
	case !filepath.IsAbs(k.PluginDir):
		return "kubernetes.plugin_dir", fmt.Errorf("want an absolute path, got %q", k.PluginDir)
	case !filepath.IsAbs(k.PodResourcesSocket) || len(k.PodResourcesSocket) > 107:
		return "kubernetes.pod_resources_socket", fmt.Errorf("want an absolute socket path of at most 107 bytes, got %q", k.PodResourcesSocket)
	case k.ReconcileInterval < Duration(100*time.Millisecond):
		return "kubernetes.reconcile_interval", errors.New("at least 100ms")
	case k.ReleaseGrace < k.ReconcileInterval:
		return "kubernetes.release_grace", fmt.Errorf("at least kubernetes.reconcile_interval (%s)", time.Duration(k.ReconcileInterval))
	case k.FeaturesFile != "" && !filepath.IsAbs(k.FeaturesFile):
		return "kubernetes.features_file", fmt.Errorf("want an absolute path or \"\", got %q", k.FeaturesFile)
	case k.MaxHolds < 0:
		return "kubernetes.max_holds", errors.New("must not be negative")
	}
	return "", nil
}

// podOptions are the placer's part of the section: how devices are named
// and offered; FPGA resources are the bitstream library's entries.
func (k KubernetesConfig) podOptions(h *hardware.Host, log *slog.Logger) *hostplacer.PodOptions {
	if !k.DevicePlugin {
		return nil
	}
	o := &hostplacer.PodOptions{Prefix: k.ResourcePrefix, ShareReplicas: k.ShareReplicas}
	if lib := h.Library(); lib != nil {
		o.Bitstreams = func() []hostplacer.PodBitstream {
			bs, err := lib.List()
			if err != nil {
				log.Warn("bitstream library unreadable: no FPGA resources for kubelet", "err", err)
				return nil
			}
			out := make([]hostplacer.PodBitstream, len(bs))
			for i, b := range bs {
				out[i] = hostplacer.PodBitstream{Name: b.Name, ID: b.ID}
			}
			return out
		}
	}
	if f := h.FPGAs(); f != nil {
		o.Accepts = func(region, bitstream string) bool {
			_, _, err := f.Check(region, bitstream)
			return err == nil
		}
	}
	return o
}

// podPool is the daemon as the device plugin sees it (deviceplugin.Pool):
// the placer's resources and choices, the job manager's admission and
// holds.
type podPool struct {
	mgr    *jobs.Manager
	placer *hostplacer.Placer
	cdi    string
	// simulated: the devices' nodes are fixture files, not devices, and
	// are left out of what a container is given (the container runtime
	// refuses a device that is not one).
	simulated bool
	// features computes the node features (nodeFeatures over the host).
	features func() map[string]string
	log      *slog.Logger

	mu sync.Mutex
	// preferred keeps the recent GetPreferredAllocation answers (by
	// resource and the IDs chosen) with their explanations, so the hold
	// kubelet then allocates on them records why they were chosen.
	preferred map[string]preference
}

type preference struct {
	explain string
	at      time.Time
}

// preferenceTTL is how long a preference waits for kubelet's Allocate;
// maxPreferences bounds how many wait (the oldest go first).
const (
	preferenceTTL  = 5 * time.Minute
	maxPreferences = 1024
)

var _ deviceplugin.Pool = (*podPool)(nil)

func preferenceKey(resource string, ids []string) string {
	s := slices.Clone(ids)
	slices.Sort(s)
	return resource + "\x00" + strings.Join(s, ",")
}

func (p *podPool) Resources() []deviceplugin.Resource {
	var out []deviceplugin.Resource
	for _, r := range p.placer.PodResources() {
		res := deviceplugin.Resource{Name: r.Name, Devices: make([]deviceplugin.Device, len(r.Devices))}
		for i, d := range r.Devices {
			res.Devices[i] = deviceplugin.Device{ID: d.ID, Healthy: d.Healthy, NUMA: d.NUMA}
		}
		out = append(out, res)
	}
	return out
}

// Watch calls fn after every job event (a job placed or ended changes
// what pods may have) and every device event, and every
// watchPoll besides: an inventory change (a MIG layout applied) reaches
// the placer after the driver's event, and the plugin sends kubelet only
// what changed.
func (p *podPool) Watch(fn func()) (cancel func()) {
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(watchPoll)
		defer t.Stop()
		for {
			events, unsubscribe := p.mgr.Subscribe(api.Caller{Admin: true}, "")
			for open := true; open; {
				select {
				case <-ctx.Done():
					unsubscribe()
					return
				case _, open = <-events:
				case <-t.C:
				}
				fn()
			}
			// Dropped as a slow subscriber: subscribe again.
			unsubscribe()
		}
	}()
	return func() { stop(); <-done }
}

// watchPoll is how often Watch calls its function without an event.
const watchPoll = 2 * time.Second

func (p *podPool) Prefer(resource string, available, mustInclude []string, size int) ([]string, error) {
	ids, explain, err := p.placer.PreferPod(resource, available, mustInclude, size)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	p.mu.Lock()
	if p.preferred == nil {
		p.preferred = map[string]preference{}
	}
	for k, v := range p.preferred {
		if now.Sub(v.at) > preferenceTTL {
			delete(p.preferred, k)
		}
	}
	for len(p.preferred) >= maxPreferences {
		oldest := ""
		for k, v := range p.preferred {
			if oldest == "" || v.at.Before(p.preferred[oldest].at) {
				oldest = k
			}
		}
		delete(p.preferred, oldest)
	}
	p.preferred[preferenceKey(resource, ids)] = preference{explain: explain, at: now}
	p.mu.Unlock()
	p.log.Debug("kubelet asked for a preferred allocation", "resource", resource, "size", size, "available", len(available), "chosen", ids)
	return ids, nil
}

func (p *podPool) Allocate(ctx context.Context, resource string, ids []string) (deviceplugin.Allocation, error) {
	key := preferenceKey(resource, ids)
	p.mu.Lock()
	pref, ok := p.preferred[key]
	delete(p.preferred, key)
	p.mu.Unlock()
	explain := "kubelet chose these devices itself (it asked for no preference)"
	if ok {
		explain = "kubelet took fusiond's preferred devices: " + pref.explain
	}
	j, grant, err := p.mgr.AdmitPod(ctx, api.PodHold{Resource: resource, Devices: ids}, explain)
	if err != nil {
		return deviceplugin.Allocation{}, err
	}
	out := deviceplugin.Allocation{Hold: j.ID, Env: grant.Env, Nodes: grant.Nodes, Mounts: mpsDirs(grant.Env)}
	if p.simulated {
		out.Nodes = slices.DeleteFunc(slices.Clone(out.Nodes), func(n devices.DeviceNode) bool { return !isDeviceNode(n.Path) })
	}
	if p.cdi != "" && j.Allocation != nil {
		for _, id := range cdiDevices(j.Allocation) {
			out.CDI = append(out.CDI, p.cdi+"="+id)
		}
	}
	return out, nil
}

// mpsDirs are the MPS control directories a share's environment names
// (its pipe and log directories): a container reaches the GPU's MPS
// server through them, so they are mounted at the same path.
func mpsDirs(env map[string]string) []string {
	var out []string
	for _, k := range []string{"CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"} {
		if d := env[k]; d != "" {
			out = append(out, d)
		}
	}
	return out
}

// isDeviceNode reports whether path is a character or block device.
func isDeviceNode(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode()&os.ModeDevice != 0
}

// cdiDevices names what a hold's allocation holds as CDI device names
// name: GPU UUIDs, a share's GPU, a MIG instance's UUID.
func cdiDevices(a *api.Allocation) []string {
	out := slices.Clone(a.GPUs)
	if s := a.GPUShare; s != nil {
		out = append(out, s.GPU)
	}
	if m := a.MIG; m != nil && m.Instance != "" {
		out = append(out, m.Instance)
	}
	return out
}

func (p *podPool) Holds() []deviceplugin.Hold {
	js := p.mgr.PodHolds()
	out := make([]deviceplugin.Hold, len(js))
	for i, j := range js {
		out[i] = deviceplugin.Hold{ID: j.ID, Resource: j.Spec.Pod.Resource, Devices: slices.Clone(j.Spec.Pod.Devices), Pod: j.Pod, Created: cmp.Or(ptrTime(j.StartedAt), j.CreatedAt)}
	}
	return out
}

func ptrTime(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

func (p *podPool) Bind(id string, pod api.PodRef) error { return p.mgr.BindPod(id, pod) }

func (p *podPool) Release(id, why string) error { return p.mgr.ReleasePod(id, why) }

func (p *podPool) Features() map[string]string { return p.features() }

// nodeFeatures are the host's features for node-feature-discovery: the
// placer's (GPU models and counts, GPUs in MIG mode, FPGA regions and the
// bitstreams they hold), and what the daemon knows besides: NUMA nodes,
// whether any GPU can run MIG, whether the latency probes run, and
// fusiond's version.
func nodeFeatures(placer *hostplacer.Placer, hw *hardware.Host, probes func() bool, version string) func() map[string]string {
	return func() map[string]string {
		out := placer.PodFeatures()
		if out == nil {
			out = map[string]string{}
		}
		if topo := hw.Topology(); topo != nil {
			out["numa.nodes"] = strconv.Itoa(len(topo.Nodes))
		}
		if g := hw.GPUs(); g != nil {
			capable := false
			for _, gpu := range g.GPUs() {
				capable = capable || gpu.MIGCapable
			}
			out["gpu.mig.capable"] = strconv.FormatBool(capable)
		}
		out["qos.probes"] = strconv.FormatBool(probes())
		out["version"] = version
		return out
	}
}

// newDevicePlugin builds the kubelet device plugin over the daemon's
// manager and placer (nil when kubernetes.device_plugin is off).
func newDevicePlugin(k KubernetesConfig, mgr *jobs.Manager, placer *hostplacer.Placer, hw *hardware.Host, probes func() bool, version string, log *slog.Logger) (*deviceplugin.Plugin, error) {
	if !k.DevicePlugin {
		return nil, nil
	}
	pool := &podPool{mgr: mgr, placer: placer, cdi: k.CDIKind, simulated: hw.Simulated() != "", features: nodeFeatures(placer, hw, probes, version), log: log}
	p, err := deviceplugin.New(pool, deviceplugin.Config{
		Dir:           k.PluginDir,
		PodResources:  k.PodResourcesSocket,
		Reconcile:     time.Duration(k.ReconcileInterval),
		Grace:         time.Duration(k.ReleaseGrace),
		FeaturesFile:  k.FeaturesFile,
		FeaturePrefix: k.ResourcePrefix + "/",
		Logger:        log,
	})
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	return p, nil
}

// kubernetesStatus is the device plugin's part of fusionctl status (nil
// when it does not run).
func kubernetesStatus(p *deviceplugin.Plugin, mgr *jobs.Manager) *api.KubernetesStatus {
	if p == nil {
		return nil
	}
	s := p.Stats()
	lat := func(l deviceplugin.Latency) api.CallLatency {
		return api.CallLatency{Count: l.Count, Errors: l.Errors, P50: api.Duration(l.P50), P99: api.Duration(l.P99), Max: api.Duration(l.Max)}
	}
	return &api.KubernetesStatus{Resources: s.Resources, Registered: s.Registered, Registrations: s.Registrations,
		PodResources: s.PodResourcesUp, Holds: len(mgr.PodHolds()), Binds: s.Binds, Releases: s.Releases,
		Allocate: lat(s.Allocate), Preferred: lat(s.Preferred)}
}
