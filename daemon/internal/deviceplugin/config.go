package deviceplugin

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Defaults of Config's fields.
const (
	// DefaultDir is kubelet's device-plugin directory; kubelet.sock is in it.
	DefaultDir = pluginapi.DevicePluginPath
	// DefaultPodResources is kubelet's pod-resources socket.
	DefaultPodResources = "/var/lib/kubelet/pod-resources/kubelet.sock"
	// DefaultReconcile is how often the holds are compared with kubelet's
	// pod resources.
	DefaultReconcile = 10 * time.Second
	// DefaultGrace is how long a hold may be missing from kubelet's pod
	// resources before it is released.
	DefaultGrace = time.Minute
	// DefaultFeaturePrefix is the label namespace of the features written
	// for node-feature-discovery.
	DefaultFeaturePrefix = "fusiond.io/"
)

// HoldAnnotation is the container annotation Allocate sets to the ID of
// the hold that keeps the container's devices.
const HoldAnnotation = "fusiond.io/hold"

// kubeletSocket is kubelet's registration socket, in Config.Dir.
const kubeletSocket = "kubelet.sock"

// maxSocketPath is the longest path a unix socket can be bound to on Linux
// (sun_path is 108 bytes with the terminating NUL).
const maxSocketPath = 107

// Config is the plugin's configuration. The zero value of each field
// means its default.
type Config struct {
	// Dir is kubelet's device-plugin directory: kubelet.sock is in it and
	// the plugin's sockets are made in it (default DefaultDir).
	Dir string
	// PodResources is kubelet's pod-resources socket (default
	// DefaultPodResources).
	PodResources string
	// Reconcile is how often the holds are compared with kubelet's pod
	// resources (default DefaultReconcile). They are also compared right
	// after every registration with kubelet.
	Reconcile time.Duration
	// Grace is how long a hold may be missing from kubelet's pod resources
	// before it is released (default DefaultGrace). It counts from the
	// latest of: the hold's creation (kubelet calls Allocate before the
	// pod is listed), the last time it was seen, and the time the
	// pod-resources API last came back (after the plugin started, an
	// outage, or a kubelet restart), so neither a daemon restart nor a
	// kubelet restart releases the devices of running pods.
	Grace time.Duration
	// FeaturesFile is the node-feature-discovery local-source feature file
	// the plugin keeps up to date, e.g.
	// /etc/kubernetes/node-feature-discovery/features.d/fusiond; "" writes
	// none.
	FeaturesFile string
	// FeaturePrefix is the label namespace, ending in "/", the features'
	// names are written under (default DefaultFeaturePrefix).
	// nfd-master refuses kubernetes.io and its subdomains except
	// feature.node.kubernetes.io and profile.node.kubernetes.io.
	FeaturePrefix string
	// Logger receives the plugin's log (nil: discarded).
	Logger *slog.Logger
}

// dnsSubdomain is an RFC 1123 subdomain, as Kubernetes checks label
// namespaces.
var dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// withDefaults returns c with its defaults filled in, or an error naming
// every invalid field.
func (c Config) withDefaults() (Config, error) {
	if c.Dir == "" {
		c.Dir = DefaultDir
	}
	if c.PodResources == "" {
		c.PodResources = DefaultPodResources
	}
	if c.Reconcile == 0 {
		c.Reconcile = DefaultReconcile
	}
	if c.Grace == 0 {
		c.Grace = DefaultGrace
	}
	if c.FeaturePrefix == "" {
		c.FeaturePrefix = DefaultFeaturePrefix
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("deviceplugin: %s: %s", field, fmt.Sprintf(format, args...)))
	}
	c.Dir = filepath.Clean(c.Dir)
	switch {
	case !filepath.IsAbs(c.Dir):
		bad("Dir", "%q is not an absolute path", c.Dir)
	case len(filepath.Join(c.Dir, "fusiond-x.sock")) > maxSocketPath:
		bad("Dir", "%q is too long for a unix socket path (at most %d bytes with the socket's name)", c.Dir, maxSocketPath)
	}
	if !filepath.IsAbs(c.PodResources) {
		bad("PodResources", "%q is not an absolute path", c.PodResources)
	} else if len(c.PodResources) > maxSocketPath {
		bad("PodResources", "%q is longer than a unix socket path can be (%d bytes)", c.PodResources, maxSocketPath)
	}
	if c.Reconcile < 0 {
		bad("Reconcile", "%v is negative", c.Reconcile)
	}
	if c.Grace < 0 {
		bad("Grace", "%v is negative", c.Grace)
	}
	if c.FeaturesFile != "" {
		c.FeaturesFile = filepath.Clean(c.FeaturesFile)
		switch base := filepath.Base(c.FeaturesFile); {
		case !filepath.IsAbs(c.FeaturesFile):
			bad("FeaturesFile", "%q is not an absolute path", c.FeaturesFile)
		case strings.HasPrefix(base, "."):
			bad("FeaturesFile", "%q: node-feature-discovery ignores files whose name starts with a dot", c.FeaturesFile)
		}
	}
	if err := checkPrefix(c.FeaturePrefix); err != nil {
		bad("FeaturePrefix", "%v", err)
	}
	return c, errors.Join(errs...)
}

// CheckPrefix checks a resource prefix ("fusiond.io"): the domain of the
// extended resources the plugin serves (kubelet refuses kubernetes.io's)
// and the namespace of the node features.
func CheckPrefix(prefix string) error {
	if err := checkResourceName(prefix + "/x"); err != nil {
		return fmt.Errorf("want a DNS subdomain outside kubernetes.io, such as fusiond.io, got %q", prefix)
	}
	return checkPrefix(prefix + "/")
}

// cdiClass is the class part of a CDI device kind (vendor/class).
var cdiClass = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$`)

// CheckCDIKind checks a CDI device kind, vendor/class ("nvidia.com/gpu"),
// as CDI names devices: <kind>=<device>.
func CheckCDIKind(kind string) error {
	vendor, class, ok := strings.Cut(kind, "/")
	if !ok || len(vendor) > 253 || !dnsSubdomain.MatchString(vendor) || len(class) > 63 || !cdiClass.MatchString(class) {
		return fmt.Errorf("want vendor/class such as nvidia.com/gpu, got %q", kind)
	}
	return nil
}

// checkPrefix checks a label namespace as node-feature-discovery takes it.
func checkPrefix(prefix string) error {
	ns, ok := strings.CutSuffix(prefix, "/")
	switch {
	case !ok:
		return fmt.Errorf("%q does not end in \"/\"", prefix)
	case len(ns) > 253 || !dnsSubdomain.MatchString(ns):
		return fmt.Errorf("%q is not a DNS subdomain followed by \"/\"", prefix)
	}
	if ns == "kubernetes.io" || strings.HasSuffix(ns, ".kubernetes.io") {
		for _, allowed := range []string{"feature.node.kubernetes.io", "profile.node.kubernetes.io"} {
			if ns == allowed || strings.HasSuffix(ns, "."+allowed) {
				return nil
			}
		}
		return fmt.Errorf("%q: node-feature-discovery refuses the kubernetes.io namespaces other than feature.node.kubernetes.io and profile.node.kubernetes.io", prefix)
	}
	return nil
}
