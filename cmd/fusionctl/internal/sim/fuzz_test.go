package sim

import (
	"strings"
	"testing"
)

func FuzzReadPods(f *testing.F) {
	f.Add("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np,1000,1024,1,500,G2|T4\n")
	f.Add("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1024,8,1000\n")
	f.Add("name,cpu_milli\n\"")
	f.Fuzz(func(t *testing.T, s string) {
		pods, err := ReadPods(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, p := range pods {
			r := p.Request()
			if r.Validate() != nil {
				t.Fatalf("accepted pod makes an invalid request: %+v", p)
			}
		}
	})
}

func FuzzReadNodes(f *testing.F) {
	f.Add("sn,cpu_milli,memory_mib,gpu,model\nn,64000,262144,2,P100\n")
	f.Add("sn,cpu_milli,memory_mib,gpu\nn,1,1,99999999999\n")
	f.Add("sn,cpu_milli,memory_mib,gpu,model\nn,64000,262144,3,H100:1+L4:2\n")
	f.Fuzz(func(t *testing.T, s string) {
		specs, err := ReadNodes(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, n := range BuildNodes(specs) {
			if n.CPUFreeMilli < 0 || len(n.GPUs) > 64 {
				t.Fatalf("bad node %+v", n)
			}
		}
	})
}
