package topology

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/fusiond/fusiond/devices"
	"github.com/fusiond/fusiond/topology/simhost"
)

func TestHostJSONRoundTrip(t *testing.T) {
	h := discoverAt(t, writeSimhost(t))
	h.Links = []devices.Link{{A: simhost.GPUAddrs()[0], B: simhost.GPUAddrs()[1], Type: devices.NVLink, Lanes: 18}}
	b, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	var back Host
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(h, &back) {
		t.Fatalf("round trip changed the host:\n%s", b)
	}
	if d := Diff(h, &back); len(d) != 0 {
		t.Fatalf("Diff after round trip: %v", d)
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		class  uint32
		vendor uint16
		want   DeviceKind
	}{
		{0x030200, 0x10de, KindGPU},   // NVIDIA 3D controller
		{0x030000, 0x10de, KindGPU},   // NVIDIA VGA
		{0x038000, 0x1002, KindGPU},   // AMD display
		{0x030000, 0x1a03, KindOther}, // ASPEED BMC VGA
		{0x120000, 0x10ee, KindFPGA},  // Xilinx accelerator
		{0x058000, 0x10ee, KindFPGA},  // Xilinx memory-class card
		{0x120000, 0x1172, KindFPGA},  // Intel/Altera
		{0x120000, 0x1d0f, KindFPGA},  // AWS F1
		{0x120000, 0x1da3, KindNPU},   // Habana Gaudi
		{0x0b4000, 0x8086, KindNPU},   // co-processor
		{0x020000, 0x15b3, KindNIC},
		{0x020700, 0x15b3, KindNIC}, // InfiniBand
		{0x010802, 0x144d, KindStorage},
		{0x060400, 0x1000, KindBridge},
		{0x0c0330, 0x8086, KindOther},
		{0x020000, 0x10ee, KindNIC}, // Xilinx NIC is a NIC
	}
	for _, tt := range tests {
		if got := classify(tt.class, tt.vendor); got != tt.want {
			t.Errorf("classify(%06x, %04x) = %s, want %s", tt.class, tt.vendor, got, tt.want)
		}
	}
}
