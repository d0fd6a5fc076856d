// Package buildinfo carries the version, commit and build date stamped
// into fusiond and fusionctl at build time:
//
//	go build -ldflags "-X github.com/fusiond/fusiond/daemon/buildinfo.version=1.2.3 ..."
//
// The variables are written only by the linker.
//
// It imports daemon/api (the Version type) and the standard library.
package buildinfo

import (
	"runtime/debug"

	"github.com/fusiond/fusiond/daemon/api"
)

var (
	version = "dev"
	commit  = ""
	date    = ""
)

// APIVersion is the API path prefix version this build serves.
const APIVersion = "v1"

// Get returns the stamped build information, filling the commit from the
// Go toolchain's VCS stamp when the linker flags did not.
func Get() api.Version {
	v := api.Version{Version: version, Commit: commit, BuildDate: date, API: APIVersion}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			switch {
			case s.Key == "vcs.revision" && v.Commit == "":
				v.Commit = s.Value
			case s.Key == "vcs.time" && v.BuildDate == "":
				v.BuildDate = s.Value
			}
		}
	}
	if v.Commit == "" {
		v.Commit = "unknown"
	}
	if v.BuildDate == "" {
		v.BuildDate = "unknown"
	}
	return v
}
