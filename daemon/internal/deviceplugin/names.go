package deviceplugin

import (
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"strings"
	"syscall"
)

// socketBase is the socket name for resource before it is made unique:
// "fusiond-" and the resource's name with fusiond.io/ left out and every
// character other than a letter, digit, '-', '_' or '.' turned into '-'
// ("fusiond.io/gpu-h200" → "fusiond-gpu-h200", "example.com/fpga" →
// "fusiond-example.com-fpga").
func socketBase(resource string) string {
	name := strings.TrimPrefix(resource, "fusiond.io/")
	var b strings.Builder
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	s := strings.Trim(b.String(), "-.")
	if len(s) > 64 {
		s = s[:64]
	}
	if s == "" {
		s = "resource"
	}
	return "fusiond-" + s
}

// socketName is the socket name of resource, different from every name
// taken says is in use: socketBase + ".sock", or, when two resources
// sanitise to the same name, with a hash of the full resource name added.
func socketName(resource string, taken func(string) bool) string {
	base := socketBase(resource)
	name := base + ".sock"
	if !taken(name) {
		return name
	}
	h := fnv.New32a()
	h.Write([]byte(resource))
	sum := h.Sum32()
	name = fmt.Sprintf("%s-%08x.sock", base, sum)
	for i := 2; taken(name); i++ {
		name = fmt.Sprintf("%s-%08x-%d.sock", base, sum, i)
	}
	return name
}

// checkResourceName checks name as kubelet checks an extended resource
// name: "domain/name", the domain not kubernetes.io.
func checkResourceName(name string) error {
	domain, rest, ok := strings.Cut(name, "/")
	switch {
	case !ok || domain == "" || rest == "":
		return fmt.Errorf("resource name %q is not of the form domain/name", name)
	case !dnsSubdomain.MatchString(domain) || len(domain) > 253:
		return fmt.Errorf("resource name %q: %q is not a DNS subdomain", name, domain)
	case domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io"):
		return fmt.Errorf("resource name %q: the kubernetes.io domain is kubelet's own", name)
	case len(rest) > 63 || !labelName.MatchString(rest):
		return fmt.Errorf("resource name %q: %q is not a valid name", name, rest)
	}
	return nil
}

// fileID identifies one file: a file removed and made again at the same
// path has another ID even when the file system reuses the inode number,
// because its change time differs.
type fileID struct {
	dev, ino uint64
	ctime    syscall.Timespec
}

// statID is the ID of the file at path (not following a last symlink).
func statID(path string) (fileID, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return fileID{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, errors.New("no stat_t for " + path)
	}
	return fileID{dev: st.Dev, ino: st.Ino, ctime: st.Ctim}, nil
}
