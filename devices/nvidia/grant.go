package nvidia

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/fusiond/fusiond/devices"
)

// ErrNoDeviceNode means a device node a grant needs is missing.
var ErrNoDeviceNode = errors.New("nvidia: device node missing")

// Alloc is what a job was given on this host.
type Alloc struct {
	// GPUs are whole-GPU UUIDs.
	GPUs []string `json:"gpus,omitempty"`
	// MIG are MIG device UUIDs.
	MIG []string `json:"mig,omitempty"`
	// Share is a shared-GPU allocation, if any.
	Share *Share `json:"share,omitempty"`
}

// Grant returns the environment and device nodes for alloc: the control
// nodes (/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools), one
// /dev/nvidiaN per GPU, and the /dev/nvidia-caps/nvidia-capN nodes of each
// MIG instance (minors from /proc/driver/nvidia-caps/mig-minors under the
// dev root's sibling proc root). Device numbers come from stat of the
// nodes under the dev root. On a simulated host missing nodes are left
// out; on real hardware they are an error (ErrNoDeviceNode).
func (m *Manager) Grant(a Alloc) (devices.Grant, error) {
	var g devices.Grant
	var visible []string
	var paths []string
	gpuSeen := map[string]bool{}
	addGPU := func(gp GPU) {
		if !gpuSeen[gp.UUID] {
			gpuSeen[gp.UUID] = true
			paths = append(paths, fmt.Sprintf("nvidia%d", gp.Minor))
		}
	}
	for _, u := range a.GPUs {
		gp, _, err := m.gpu(u)
		if err != nil {
			return g, err
		}
		addGPU(gp)
		visible = append(visible, u)
	}
	if len(a.MIG) > 0 {
		minors, err := readMIGMinors(filepath.Join(m.procRoot, "driver/nvidia-caps/mig-minors"))
		if err != nil && m.simulated == "" {
			return g, err
		}
		for _, mu := range a.MIG {
			gp, giID, ciID, err := m.migOwner(mu)
			if err != nil {
				return g, err
			}
			addGPU(gp)
			visible = append(visible, mu)
			for _, key := range []string{
				fmt.Sprintf("gpu%d/gi%d/access", gp.Minor, giID),
				fmt.Sprintf("gpu%d/gi%d/ci%d/access", gp.Minor, giID, ciID),
			} {
				if minor, ok := minors[key]; ok {
					paths = append(paths, fmt.Sprintf("nvidia-caps/nvidia-cap%d", minor))
				} else if m.simulated == "" {
					return g, fmt.Errorf("mig %s: %s not in mig-minors: %w", mu, key, ErrNoDeviceNode)
				}
			}
		}
	}
	if a.Share != nil {
		gp, _, err := m.gpu(a.Share.GPU)
		if err != nil {
			return g, err
		}
		addGPU(gp)
		visible = append(visible, gp.UUID)
		env, err := m.shareEnv(*a.Share)
		if err != nil {
			return g, err
		}
		g.Env = env
	}
	if len(visible) == 0 {
		return g, nil
	}
	paths = append([]string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}, paths...)
	for _, p := range paths {
		n, err := statNode(filepath.Join(m.devRoot, p))
		if err != nil {
			if m.simulated != "" || (errors.Is(err, ErrNoDeviceNode) && p == "nvidia-uvm-tools") {
				continue
			}
			return devices.Grant{}, err
		}
		n.Path = filepath.Join("/dev", p)
		g.Nodes = append(g.Nodes, n)
	}
	if g.Env == nil {
		g.Env = map[string]string{}
	}
	list := strings.Join(visible, ",")
	g.Env["CUDA_VISIBLE_DEVICES"] = list
	g.Env["NVIDIA_VISIBLE_DEVICES"] = list
	return g, nil
}

func statNode(path string) (devices.DeviceNode, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return devices.DeviceNode{}, fmt.Errorf("%s: %w", path, ErrNoDeviceNode)
		}
		return devices.DeviceNode{}, fmt.Errorf("stat %s: %w", path, err)
	}
	var t devices.NodeType
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFCHR:
		t = devices.CharDevice
	case syscall.S_IFBLK:
		t = devices.BlockDevice
	default:
		return devices.DeviceNode{}, fmt.Errorf("%s is not a device node: %w", path, ErrNoDeviceNode)
	}
	rdev := uint64(st.Rdev)
	major := uint32((rdev >> 8 & 0xfff) | (rdev >> 32 & 0xfffff000))
	minor := uint32((rdev & 0xff) | (rdev >> 12 & 0xffffff00))
	return devices.DeviceNode{Path: path, Type: t, Major: major, Minor: minor, Access: "rw"}, nil
}

// readMIGMinors parses the driver's mig-minors table ("gpu0/gi1/access 12").
func readMIGMinors(path string) (map[string]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("mig-minors: %w: %w", ErrNoDeviceNode, err)
	}
	defer f.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 2 {
			continue
		}
		n, err := strconv.Atoi(fields[1])
		if err != nil {
			continue
		}
		out[fields[0]] = n
	}
	return out, sc.Err()
}

// migOwner finds the GPU, GPU-instance id and compute-instance id of a MIG
// device UUID.
func (m *Manager) migOwner(migUUID string) (GPU, int, int, error) {
	m.mu.Lock()
	gpus, handles := m.gpus, m.handles
	m.mu.Unlock()
	for i, gp := range gpus {
		if !gp.MIGEnabled {
			continue
		}
		for gi, md := range migDevices(handles[i]) {
			if md.uuid == migUUID {
				return gp, gi, md.ci, nil
			}
		}
	}
	return GPU{}, 0, 0, fmt.Errorf("mig device %s: %w", migUUID, ErrUnknownDevice)
}
