// Package nvidia is fusiond's NVIDIA GPU driver and the only package that
// imports github.com/NVIDIA/go-nvml. It has two layers:
//
//   - a thin layer over nvml.Interface (this file and sim.go) that turns
//     nvml.Return codes into Go errors and is given either the real library
//     or one of go-nvml's mock servers (dgxa100, dgxh100, dgxh200, dgxb200);
//   - a domain layer above it: inventory, MIG profiles and layouts with a pure
//     planner and an idempotent applier, shared-GPU admission (MPS or
//     time-slicing), grants for the executor, health with probation, and
//     telemetry.
//
// Driver presents the Manager to the daemon as a devices.Driver: its GPUs
// and MIG layouts as an inventory, health transitions, telemetry sweeps
// and MIG changes as updates, and per-job preparation (share admission,
// on-demand MIG instance creation, grants). Everything MIG-specific the
// daemon needs lives here, behind that interface.
//
// It owns the host's NVIDIA GPUs and may import the standard library,
// go-nvml and devices; nothing of the daemon.
//
// Without an NVIDIA driver Open returns ErrNoDriver and the daemon runs with
// zero GPUs.
package nvidia

import (
	"errors"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Sentinel errors callers branch on.
var (
	// ErrNoDriver means the NVML library (the NVIDIA driver) is not present.
	ErrNoDriver = errors.New("nvidia: no NVIDIA driver (libnvidia-ml not found)")
	// ErrNotSupported means the device or the NVML implementation does not
	// offer the queried feature.
	ErrNotSupported = errors.New("nvidia: not supported")
	// ErrGPULost means the GPU fell off the bus or stopped answering.
	ErrGPULost = errors.New("nvidia: GPU is lost")
	// ErrUnknownDevice means a UUID or index named no GPU of this host.
	ErrUnknownDevice = errors.New("nvidia: unknown device")
)

// nvmlErr converts an NVML return code into an error wrapping one of the
// sentinels where one applies; SUCCESS becomes nil.
func nvmlErr(op string, ret nvml.Return) error {
	switch ret {
	case nvml.SUCCESS:
		return nil
	case nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED:
		return fmt.Errorf("%s: %w", op, ErrNoDriver)
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
		return fmt.Errorf("%s: %w", op, ErrNotSupported)
	case nvml.ERROR_GPU_IS_LOST:
		return fmt.Errorf("%s: %w", op, ErrGPULost)
	default:
		return fmt.Errorf("%s: %w", op, ret)
	}
}

// call runs one NVML query. go-nvml's mock servers implement only part of
// the API and panic when an unimplemented method is called; call turns that
// into ErrNotSupported so a bare mock behaves like a device lacking the
// feature.
func call[T any](op string, f func() (T, nvml.Return)) (v T, err error) {
	defer func() {
		if r := recover(); r != nil {
			// Only the mock's "method is nil" panic is expected; anything
			// else is a bug and keeps panicking.
			if s, ok := r.(string); !ok || !strings.Contains(s, "method is nil") {
				panic(r)
			}
			var zero T
			v, err = zero, fmt.Errorf("%s: %w (mock: %s)", op, ErrNotSupported, r)
		}
	}()
	v, ret := f()
	return v, nvmlErr(op, ret)
}

// call0 is call for NVML functions that return only a code.
func call0(op string, f func() nvml.Return) error {
	_, err := call(op, func() (struct{}, nvml.Return) { return struct{}{}, f() })
	return err
}

// cString converts a NUL-terminated C char array to a Go string.
func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}
