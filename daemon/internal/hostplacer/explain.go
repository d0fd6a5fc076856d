package hostplacer

import (
	"fmt"
	"slices"
	"strings"

	"github.com/fusiond/fusiond/daemon/sched"
)

// explain is a decision's explanation (what fusionctl show prints as the
// allocation's placement) with the devices its candidates name by engine
// index given by device ID. The caller holds p.mu.
func (p *Placer) explain(d *sched.Decision) string {
	var gpus []int
	for _, c := range d.Candidates {
		if a := c.Assignment; a != nil {
			gpus = append(gpus, a.GPUs...)
			if a.MIG != nil {
				gpus = append(gpus, a.MIG.GPU)
			}
		}
	}
	slices.Sort(gpus)
	gpus = slices.Compact(gpus)
	var b strings.Builder
	b.WriteString(strings.TrimSpace(d.Explain()))
	if len(gpus) > 0 {
		b.WriteString("\n  gpu")
		for _, g := range gpus {
			if g >= 0 && g < len(p.hw.GPUs) {
				fmt.Fprintf(&b, " %d=%s", g, p.hw.GPUs[g].ID)
			}
		}
	}
	for i, g := range p.node.GPUs {
		if g.MPS && g.ShareOwner != "" && i < len(p.hw.GPUs) {
			fmt.Fprintf(&b, "\n  gpu %d (MPS: one user's shares at a time) serves %s", i, g.ShareOwner)
		}
	}
	return b.String()
}
