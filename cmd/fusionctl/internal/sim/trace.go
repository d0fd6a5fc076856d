package sim

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/fusiond/fusiond/daemon/sched"
)

// ErrBadTrace means a CSV file does not have the openb layout.
var ErrBadTrace = errors.New("sim: bad trace")

// NodeSpec is one row of an openb node list. Model is the model column
// as written: one model for all GPUs ("V100M16"), or for a node with
// several models each with its count, "MODEL:COUNT" joined by "+"
// ("H100:1+L4:2", the counts summing to GPUs; ReadNodes checks it).
type NodeSpec struct {
	Name     string
	CPUMilli int64
	MemMiB   int64
	GPUs     int
	Model    string
}

// ModelCount is one GPU model of a node and how many GPUs of it.
type ModelCount struct {
	Model string
	GPUs  int
}

// Groups are the node's GPU models with their counts: one group for a
// node of one model (even with no GPUs), one per model for a mixed node.
func (n NodeSpec) Groups() []ModelCount {
	gs, err := parseModels(n.Model, n.GPUs)
	if err != nil {
		return []ModelCount{{Model: n.Model, GPUs: n.GPUs}}
	}
	return gs
}

// canHold reports whether the empty node can run pod p: its CPU, memory
// and all its GPUs from one group of an allowed model.
func (n NodeSpec) canHold(p *Pod) bool {
	if p.CPUMilli > n.CPUMilli || p.MemMiB > n.MemMiB {
		return false
	}
	for _, g := range n.Groups() {
		if p.GPUs <= g.GPUs && (p.GPUSpec == "" || slices.Contains(strings.Split(p.GPUSpec, "|"), g.Model)) {
			return true
		}
	}
	return false
}

// parseModels reads a model column: a plain model, or "MODEL:COUNT"
// parts joined by "+" whose counts sum to gpus.
func parseModels(col string, gpus int) ([]ModelCount, error) {
	if !strings.Contains(col, ":") && !strings.Contains(col, "+") {
		return []ModelCount{{Model: col, GPUs: gpus}}, nil
	}
	var out []ModelCount
	sum := 0
	for part := range strings.SplitSeq(col, "+") {
		m, c, ok := strings.Cut(part, ":")
		k, err := strconv.Atoi(c)
		switch {
		case !ok || m == "" || err != nil || k < 1 || k > 64:
			return nil, fmt.Errorf("model %q: want MODEL:COUNT (COUNT 1..64) parts joined by +", part)
		case slices.ContainsFunc(out, func(g ModelCount) bool { return g.Model == m }):
			return nil, fmt.Errorf("model %q named twice", m)
		}
		out = append(out, ModelCount{Model: m, GPUs: k})
		sum += k
	}
	if sum != gpus {
		return nil, fmt.Errorf("the models' counts sum to %d, the gpu column says %d", sum, gpus)
	}
	return out, nil
}

// Pod is one row of an openb pod list. Times are seconds; zero deletion
// means the pod never left during the trace.
type Pod struct {
	Name      string
	CPUMilli  int64
	MemMiB    int64
	GPUs      int
	GPUMilli  int64
	GPUSpec   string
	QoS       string
	Creation  int64
	Deletion  int64
	Scheduled int64
}

// GPUMilliTotal is the pod's total GPU request.
func (p *Pod) GPUMilliTotal() int64 { return int64(p.GPUs) * p.GPUMilli }

// Request converts the pod to a scheduling request. openb has no job
// classes: every pod is batch; the QoS maps to a tier.
func (p *Pod) Request() sched.Request {
	r := sched.Request{ID: p.Name, Class: sched.ClassBatch, CPUMilli: p.CPUMilli, MemMiB: p.MemMiB, GPUs: p.GPUs, GPUMilli: p.GPUMilli}
	if r.GPUs == 0 {
		r.GPUMilli = 0
	}
	if p.GPUSpec != "" {
		r.GPUModels = strings.Split(p.GPUSpec, "|")
	}
	switch p.QoS {
	case "BE":
		r.Tier = sched.TierBestEffort
	case "LS", "Guaranteed":
		r.Tier = sched.TierGuaranteed
	default:
		r.Tier = sched.TierBurstable
	}
	return r
}

type table struct {
	col  map[string]int
	rows [][]string
}

func readTable(r io.Reader, required ...string) (*table, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	recs, err := cr.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadTrace, err)
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("%w: empty file", ErrBadTrace)
	}
	t := &table{col: map[string]int{}, rows: recs[1:]}
	for i, h := range recs[0] {
		t.col[strings.TrimSpace(h)] = i
	}
	for _, h := range required {
		if _, ok := t.col[h]; !ok {
			return nil, fmt.Errorf("%w: missing column %q", ErrBadTrace, h)
		}
	}
	return t, nil
}

func (t *table) str(row []string, name string) string {
	i, ok := t.col[name]
	if !ok || i >= len(row) {
		return ""
	}
	return strings.TrimSpace(row[i])
}

func (t *table) int(row []string, name string, line int) (int64, error) {
	s := t.str(row, name)
	if s == "" {
		return 0, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%w: line %d column %s: %q", ErrBadTrace, line, name, s)
	}
	return v, nil
}

// ReadNodes parses an openb node list (sn,cpu_milli,memory_mib,gpu,model);
// see NodeSpec for a model column naming several models.
func ReadNodes(r io.Reader) ([]NodeSpec, error) {
	t, err := readTable(r, "sn", "cpu_milli", "memory_mib", "gpu")
	if err != nil {
		return nil, err
	}
	out := make([]NodeSpec, 0, len(t.rows))
	for i, row := range t.rows {
		var n NodeSpec
		n.Name, n.Model = t.str(row, "sn"), t.str(row, "model")
		var g int64
		if n.CPUMilli, err = t.int(row, "cpu_milli", i+2); err != nil {
			return nil, err
		}
		if n.MemMiB, err = t.int(row, "memory_mib", i+2); err != nil {
			return nil, err
		}
		if g, err = t.int(row, "gpu", i+2); err != nil {
			return nil, err
		}
		if g > 64 {
			return nil, fmt.Errorf("%w: line %d: %d GPUs", ErrBadTrace, i+2, g)
		}
		n.GPUs = int(g)
		if _, err := parseModels(n.Model, n.GPUs); err != nil {
			return nil, fmt.Errorf("%w: line %d: %w", ErrBadTrace, i+2, err)
		}
		out = append(out, n)
	}
	return out, nil
}

// ReadPods parses an openb pod list; the time columns are optional.
func ReadPods(r io.Reader) ([]Pod, error) {
	t, err := readTable(r, "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
	if err != nil {
		return nil, err
	}
	out := make([]Pod, 0, len(t.rows))
	for i, row := range t.rows {
		p := Pod{Name: t.str(row, "name"), GPUSpec: t.str(row, "gpu_spec"), QoS: t.str(row, "qos")}
		var g int64
		fields := []struct {
			name string
			dst  *int64
		}{{"cpu_milli", &p.CPUMilli}, {"memory_mib", &p.MemMiB}, {"num_gpu", &g}, {"gpu_milli", &p.GPUMilli},
			{"creation_time", &p.Creation}, {"deletion_time", &p.Deletion}, {"scheduled_time", &p.Scheduled}}
		for _, f := range fields {
			if *f.dst, err = t.int(row, f.name, i+2); err != nil {
				return nil, err
			}
		}
		if g > 64 || p.GPUMilli > sched.MilliPerGPU || (g > 1 && p.GPUMilli != sched.MilliPerGPU) || (g > 0 && p.GPUMilli == 0) {
			return nil, fmt.Errorf("%w: line %d: %d GPUs × %d milli", ErrBadTrace, i+2, g, p.GPUMilli)
		}
		p.GPUs = int(g)
		if p.GPUs == 0 {
			p.GPUMilli = 0
		}
		out = append(out, p)
	}
	return out, nil
}

// BuildNodes makes fresh scheduler nodes from specs.
func BuildNodes(specs []NodeSpec) []*sched.Node {
	out := make([]*sched.Node, len(specs))
	for i, s := range specs {
		gs := s.Groups()
		if len(gs) == 1 {
			out[i] = sched.NewNode(s.Name, s.CPUMilli, s.MemMiB, s.GPUs, gs[0].Model)
			continue
		}
		// A mixed node: each GPU names its model.
		n := sched.NewNode(s.Name, s.CPUMilli, s.MemMiB, s.GPUs, "")
		j := 0
		for _, g := range gs {
			for range g.GPUs {
				n.GPUs[j].Model = g.Model
				j++
			}
		}
		out[i] = n
	}
	return out
}
