package daemon

import (
	"path/filepath"
	"strings"
	"testing"
)

// Without resctrl the loop runs with one actuator, and the status says
// why: switched off, or no filesystem at the root (this host has none).
func TestOpenResctrlSaysWhyNot(t *testing.T) {
	cfg := DefaultQoSConfig()
	cfg.Resctrl = false
	if c, off := openResctrl(cfg, nil); c != nil || off != "off: qos.resctrl is false" {
		t.Errorf("switched off: %v, %q", c, off)
	}
	cfg.Resctrl, cfg.ResctrlRoot = true, filepath.Join(t.TempDir(), "resctrl")
	c, off := openResctrl(cfg, nil)
	if c != nil || !strings.HasPrefix(off, "off: resctrl: not available") || !strings.Contains(off, cfg.ResctrlRoot) {
		t.Errorf("no filesystem: %v, %q", c, off)
	}
}
