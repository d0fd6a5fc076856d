package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
)

// show says whether the daemon may move a job, how often it did and for
// which job it is moving it; a job that cannot be moved says nothing.
func TestShowSaysHowTheJobMoved(t *testing.T) {
	for _, c := range []struct {
		job  api.Job
		want string
	}{
		{api.Job{ID: "3", Tier: api.TierBurstable, Spec: api.JobSpec{Movable: true}, Moves: 2}, "yes; moved 2 times"},
		{api.Job{ID: "3", Tier: api.TierBestEffort, MovingFor: "7"}, "yes; being moved to make room for job 7"},
		{api.Job{ID: "3", Tier: api.TierGuaranteed}, ""},
	} {
		var b bytes.Buffer
		if err := showJob(&b, c.job); err != nil {
			t.Fatal(err)
		}
		switch {
		case c.want == "" && strings.Contains(b.String(), "Movable:"):
			t.Errorf("a job that cannot be moved shows a Movable line:\n%s", b.String())
		case c.want != "" && !strings.Contains(b.String(), c.want):
			t.Errorf("show lacks %q:\n%s", c.want, b.String())
		}
	}
}
