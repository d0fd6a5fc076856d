module github.com/fusiond/fusiond

go 1.26.0

require (
	github.com/cilium/ebpf v0.22.0
	github.com/containerd/cgroups/v3 v3.1.3
	github.com/opencontainers/runtime-spec v1.3.0
	golang.org/x/sys v0.50.0
)

require gopkg.in/check.v1 v1.0.0-20201130134442-10cb98267c6c // indirect

require (
	github.com/containerd/log v0.1.0 // indirect
	github.com/coreos/go-systemd/v22 v22.7.0
	github.com/docker/go-units v0.5.0 // indirect
	github.com/godbus/dbus/v5 v5.1.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/moby/sys/userns v0.1.0 // indirect
	github.com/sirupsen/logrus v1.9.4 // indirect
	github.com/spf13/cobra v1.10.2
	github.com/spf13/pflag v1.0.10 // indirect
	go.etcd.io/bbolt v1.5.0
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	google.golang.org/protobuf v1.35.2 // indirect
	sigs.k8s.io/yaml v1.6.0
)
