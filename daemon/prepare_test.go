package daemon

import (
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/devices"
)

// TestDriverAllocationsShareOwner: a GPU share reaches its driver with the
// job owner's uid and gid (an MPS GPU serves one user and gives that user
// its pipe and log directories).
func TestDriverAllocationsShareOwner(t *testing.T) {
	a := &api.Allocation{GPUShare: &api.GPUShare{GPU: "GPU-1", Milli: 250, MemoryMB: 4096}}
	per := driverAllocations(a, api.Owner{UID: 1000, GID: 1001, User: "ana"})
	s := per[devices.GPU].Share
	if s == nil || *s != (devices.Share{Device: "GPU-1", Milli: 250, MemoryMB: 4096, UID: 1000, GID: 1001}) {
		t.Fatalf("share %+v", s)
	}
}
