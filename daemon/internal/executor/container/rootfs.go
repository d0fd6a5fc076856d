package container

import (
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
)

// BuildBusyboxRootfs makes a minimal root filesystem in dst from a
// statically linked busybox binary: bin/busybox with a relative symlink per
// applet, and empty proc, sys, dev, tmp and etc. It serves demos, tests
// and benchmarks.
func BuildBusyboxRootfs(dst, busybox string) error {
	for _, d := range []string{"bin", "proc", "sys", "dev", "tmp", "etc"} {
		if err := os.MkdirAll(filepath.Join(dst, d), 0o755); err != nil {
			return err
		}
	}
	data, err := os.ReadFile(busybox)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dst, "bin", "busybox"), data, 0o755); err != nil {
		return err
	}
	list, err := osexec.Command(busybox, "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	for _, applet := range strings.Fields(string(list)) {
		if applet == "busybox" {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(dst, "bin", applet)); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	return nil
}
