package executor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/executor/exectest"
)

// TestPathLookupAsCaller: a command found only in a directory the job's
// user cannot search gets the same error as a missing command: the look-up
// is the user's, not root's. It needs useradd, so it runs on the host, not
// in the cgroup v2 VM (which runs only TestKernel*).
func TestPathLookupAsCaller(t *testing.T) {
	r := newTestRunner(t)
	b := exectest.NeedUser(t, "fusiond-tb")
	base, err := os.MkdirTemp("", "fusiond-lookup-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	hidden := filepath.Join(base, "hidden")
	if err := os.Mkdir(hidden, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hidden, "present-tool"), []byte("#!/bin/sh\necho ran\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	startErr := func(id, name string) string {
		req := r.request(id, api.TierBurstable, 100, 64*mib, name)
		req.UID, req.GID = b.UID, b.GID
		req.Env = []string{"PATH=" + hidden}
		p, err := r.Start(t.Context(), req)
		if err == nil {
			e := waitExit(t, p, 10e9)
			t.Fatalf("%s started for uid %d (exit %+v: %s)", name, b.UID, e, readLog(t, req))
		}
		return strings.ReplaceAll(err.Error(), name, "NAME")
	}
	present, absent := startErr("present", "present-tool"), startErr("absent", "absent-tool")
	if present != absent {
		t.Errorf("an executable in an unsearchable directory and a missing one differ:\n%s\n%s", present, absent)
	}
	if !strings.Contains(absent, `"NAME" not found in the job's PATH`) {
		t.Errorf("missing command: %s", absent)
	}
	// Root, who can search the directory, finds it.
	req := r.request("root", api.TierBurstable, 100, 64*mib, "present-tool")
	req.Env = []string{"PATH=" + hidden}
	if e := waitExit(t, r.start(req), 10e9); e.Code != 0 || strings.TrimSpace(readLog(t, req)) != "ran" {
		t.Errorf("root's job: exit %+v: %s", e, readLog(t, req))
	}
}
