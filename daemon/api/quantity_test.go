package api_test

import (
	"math"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
)

// TestBytesMiB pins the engine-unit conversions: MiB rounds up (as the
// float ceiling the placer used before), WholeMiB down, and BytesOfMiB is
// their inverse on whole MiB.
func TestBytesMiB(t *testing.T) {
	for _, b := range []api.Bytes{0, 1, 1<<20 - 1, 1 << 20, 1<<20 + 1, 3<<30 + 5, 2 << 40, -1, -(1 << 20), -(3 << 19)} {
		if got, want := b.MiB(), int64(math.Ceil(float64(b)/(1<<20))); got != want {
			t.Errorf("%d.MiB() = %d, want %d", b, got, want)
		}
		if got, want := b.WholeMiB(), int64(b>>20); got != want {
			t.Errorf("%d.WholeMiB() = %d, want %d", b, got, want)
		}
	}
	if got := api.BytesOfMiB(3); got != 3<<20 || got.MiB() != 3 || got.WholeMiB() != 3 {
		t.Errorf("BytesOfMiB(3) = %d", got)
	}
}
