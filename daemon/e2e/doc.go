// Package e2e holds fusiond's end-to-end tests: they build the real
// fusiond and fusionctl binaries, start the daemon on a temporary socket and
// state directory, and drive it through fusionctl and the API client,
// including as an unprivileged user and across a kill -9. They need root.
//
// Test-only: it may import anything it drives (the API client, cgroups,
// the executor's test helpers); nothing imports it.
package e2e
