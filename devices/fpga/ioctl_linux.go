package fpga

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func ioctlPtr(fd int, req uint, args *dflPortPRArgs) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(unsafe.Pointer(args)))
	if errno != 0 {
		return errno
	}
	return nil
}
