package daemon

import (
	"errors"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
)

func TestKubernetesConfigValidation(t *testing.T) {
	on := "kubernetes:\n  device_plugin: true\n"
	for _, tc := range []struct{ yaml, field string }{
		{on + "  resource_prefix: Fusiond.IO\n", "kubernetes.resource_prefix"},
		{on + "  resource_prefix: kubernetes.io\n", "kubernetes.resource_prefix"},
		{on + "  resource_prefix: gpu.kubernetes.io\n", "kubernetes.resource_prefix"},
		{on + "  share_replicas: 1\n", "kubernetes.share_replicas"},
		{on + "  share_replicas: 1001\n", "kubernetes.share_replicas"},
		{on + "  plugin_dir: device-plugins\n", "kubernetes.plugin_dir"},
		{on + "  pod_resources_socket: kubelet.sock\n", "kubernetes.pod_resources_socket"},
		{on + "  reconcile_interval: 10ms\n", "kubernetes.reconcile_interval"},
		{on + "  reconcile_interval: 10s\n  release_grace: 5s\n", "kubernetes.release_grace"},
		{on + "  features_file: features\n", "kubernetes.features_file"},
		{on + "  max_holds: -1\n", "kubernetes.max_holds"},
		{on + "  cdi_kind: gpu\n", "kubernetes.cdi_kind"},
		{on + "  cdi_kind: nvidia.com/gpu=x\n", "kubernetes.cdi_kind"},
		{on + "  bogus: 1\n", "kubernetes.bogus"},
	} {
		cfg := DefaultConfig()
		err := ParseConfig([]byte(tc.yaml), &cfg)
		var e *api.Error
		if !errors.As(err, &e) || e.Field != tc.field {
			t.Errorf("%q: error %v, want one about %s", tc.yaml, err, tc.field)
		}
	}
	cfg := DefaultConfig()
	if err := ParseConfig([]byte(on+"  resource_prefix: accel.example.com\n  share_replicas: 4\n  cdi_kind: nvidia.com/gpu\n  features_file: \"\"\n"), &cfg); err != nil {
		t.Fatalf("a good kubernetes section: %v", err)
	}
	if k := cfg.Kubernetes; k.ResourcePrefix != "accel.example.com" || k.ShareReplicas != 4 || k.CDIKind != "nvidia.com/gpu" || k.FeaturesFile != "" {
		t.Errorf("parsed %+v", k)
	}
	if DefaultConfig().Kubernetes.DevicePlugin {
		t.Error("the device plugin is on by default")
	}
}
