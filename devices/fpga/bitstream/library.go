package bitstream

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Library errors callers branch on.
var (
	// ErrNotFound: no bitstream matches the reference.
	ErrNotFound = errors.New("bitstream not found")
	// ErrAmbiguous: a reference (id prefix, AFU ID) matches several bitstreams.
	ErrAmbiguous = errors.New("ambiguous bitstream reference")
	// ErrNameTaken: another bitstream already has this name.
	ErrNameTaken = errors.New("bitstream name already in use")
	// ErrInvalidName: the name is not one a job spec can reference.
	ErrInvalidName = errors.New("invalid bitstream name")
	// ErrDuplicate: the content is already in the library under another
	// name; the error names it and Add returns that entry.
	ErrDuplicate = errors.New("bitstream content already in the library")
)

// nameRE is the rule job specs use for resources.fpga.bitstream (api's
// refNameRE): a name the library accepts can always be referenced.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:+-]*$`)

// MaxNameLen is the longest bitstream name.
const MaxNameLen = 128

// Bitstream is one entry of the library.
type Bitstream struct {
	// ID is the lower-case hex sha256 of the file's content.
	ID     string    `json:"id"`
	Name   string    `json:"name"`
	Size   int64     `json:"size"`
	Added  time.Time `json:"added"`
	Header Header    `json:"header"`
	// Path is where the content lives; drivers open it to program.
	Path string `json:"-"`
}

// Library is a content-addressed bitstream store in one directory:
// blobs/<sha256> holds the content, index/<sha256>.json the metadata.
// It is safe for concurrent use by one process.
type Library struct {
	dir string
	log *slog.Logger
	now func() time.Time

	mu    sync.Mutex
	cache []Bitstream // the index, read once at open, kept sorted by name
}

// OpenLibrary opens (creating if needed) the library in dir.
func OpenLibrary(dir string, log *slog.Logger) (*Library, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for _, d := range []string{"blobs", "index", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("bitstream library: %w", err)
		}
	}
	l := &Library{dir: dir, log: log, now: time.Now}
	var err error
	if l.cache, err = l.readIndex(); err != nil {
		return nil, err
	}
	return l, nil
}

// AddFile adds the file at path; name defaults to its base name without
// extension.
func (l *Library) AddFile(path, name string) (Bitstream, error) {
	f, err := os.Open(path)
	if err != nil {
		return Bitstream{}, fmt.Errorf("add bitstream: %w", err)
	}
	defer f.Close()
	base := filepath.Base(path)
	if name == "" {
		name = strings.TrimSuffix(base, filepath.Ext(base))
	}
	return l.add(f, name, base)
}

// Add reads a bitstream from r in one pass (copying it into the library
// while hashing it and keeping only its first HeadSize bytes for the
// header parser), validates the header and stores it under name. fileName
// is the original file name, used only to admit raw .bin/.rbf content.
// Adding content that is already present under the same name returns the
// existing entry; under another name it returns the existing entry with an
// error wrapping ErrDuplicate that names it.
func (l *Library) Add(r io.Reader, name, fileName string) (Bitstream, error) {
	return l.add(r, name, fileName)
}

// headWriter keeps the first cap(buf) bytes written to it.
type headWriter struct{ buf []byte }

func (w *headWriter) Write(p []byte) (int, error) {
	if room := cap(w.buf) - len(w.buf); room > 0 {
		w.buf = append(w.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (l *Library) add(r io.Reader, name, fileName string) (Bitstream, error) {
	if err := validName(name); err != nil {
		return Bitstream{}, err
	}
	tmp, err := os.CreateTemp(filepath.Join(l.dir, "tmp"), "add-*")
	if err != nil {
		return Bitstream{}, fmt.Errorf("add bitstream: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	hw := &headWriter{buf: make([]byte, 0, HeadSize)}
	sum := sha256.New()
	size, err := io.Copy(io.MultiWriter(tmp, sum, hw), r)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Bitstream{}, fmt.Errorf("add bitstream %q: %w", name, err)
	}
	hdr, err := Parse(hw.buf, size, fileName)
	if err != nil {
		return Bitstream{}, fmt.Errorf("add bitstream %q: %w", name, err)
	}
	b := Bitstream{ID: hex.EncodeToString(sum.Sum(nil)), Name: name, Size: size, Header: hdr, Added: l.now().UTC()}

	l.mu.Lock()
	defer l.mu.Unlock()
	all, err := l.listLocked()
	if err != nil {
		return Bitstream{}, err
	}
	for _, e := range all {
		if e.ID == b.ID {
			if e.Name == name {
				return e, nil
			}
			return e, fmt.Errorf("%w as %q (%s); not added again as %q", ErrDuplicate, e.Name, e.ID[:12], name)
		}
		if e.Name == name {
			return Bitstream{}, fmt.Errorf("%w: %q is %s", ErrNameTaken, name, e.ID[:12])
		}
	}
	b.Path = l.blobPath(b.ID)
	if err := os.Chmod(tmp.Name(), 0o400); err != nil {
		return Bitstream{}, fmt.Errorf("add bitstream: %w", err)
	}
	if err := os.Rename(tmp.Name(), b.Path); err != nil {
		return Bitstream{}, fmt.Errorf("add bitstream: %w", err)
	}
	if err := l.writeIndex(b); err != nil {
		os.Remove(b.Path)
		return Bitstream{}, err
	}
	l.cache = append(l.cache, b)
	sortByName(l.cache)
	l.log.Info("bitstream added", "id", b.ID, "name", name, "format", hdr.Format, "size", size)
	return b, nil
}

func validName(name string) error {
	if len(name) > MaxNameLen || !nameRE.MatchString(name) {
		return fmt.Errorf("%w %q: want at most %d letters, digits and . _ : + -, starting with a letter or digit", ErrInvalidName, name, MaxNameLen)
	}
	return nil
}

func (l *Library) blobPath(id string) string  { return filepath.Join(l.dir, "blobs", id) }
func (l *Library) indexPath(id string) string { return filepath.Join(l.dir, "index", id+".json") }

func (l *Library) writeIndex(b Bitstream) error {
	data, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return fmt.Errorf("bitstream index: %w", err)
	}
	tmp := l.indexPath(b.ID) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("bitstream index: %w", err)
	}
	if err := os.Rename(tmp, l.indexPath(b.ID)); err != nil {
		return fmt.Errorf("bitstream index: %w", err)
	}
	return nil
}

// List returns every bitstream, sorted by name.
func (l *Library) List() ([]Bitstream, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.listLocked()
}

func (l *Library) listLocked() ([]Bitstream, error) {
	return slices.Clone(l.cache), nil
}

func sortByName(bs []Bitstream) {
	sort.Slice(bs, func(i, j int) bool { return bs[i].Name < bs[j].Name })
}

// readIndex loads the on-disk index.
func (l *Library) readIndex() ([]Bitstream, error) {
	ents, err := os.ReadDir(filepath.Join(l.dir, "index"))
	if err != nil {
		return nil, fmt.Errorf("bitstream library: %w", err)
	}
	out := make([]Bitstream, 0, len(ents))
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(l.dir, "index", e.Name()))
		if err != nil {
			return nil, fmt.Errorf("bitstream library: %w", err)
		}
		var b Bitstream
		if err := json.Unmarshal(data, &b); err != nil {
			l.log.Warn("skipping unreadable bitstream index entry", "file", e.Name(), "err", err)
			continue
		}
		if !validID(b.ID) || e.Name() != b.ID+".json" {
			// The ID names files in the library: never trust one that
			// could point outside it.
			l.log.Warn("skipping bitstream index entry with a bad id", "file", e.Name(), "id", b.ID)
			continue
		}
		b.Path = l.blobPath(b.ID)
		out = append(out, b)
	}
	sortByName(out)
	return out, nil
}

// Get resolves a reference: a full id, a unique id prefix of at least 8
// hex digits, a name, or an AFU ID (GBS accelerator-type-uuid / xclbin
// uuid) that exactly one bitstream carries.
func (l *Library) Get(ref string) (Bitstream, error) {
	all, err := l.List()
	if err != nil {
		return Bitstream{}, err
	}
	return Resolve(all, ref)
}

// Resolve applies Get's rules to a list of bitstreams.
func Resolve(all []Bitstream, ref string) (Bitstream, error) {
	ref = strings.TrimSpace(ref)
	for _, b := range all {
		if b.ID == ref || b.Name == ref {
			return b, nil
		}
	}
	var hits []Bitstream
	if len(ref) >= 8 && isHex(ref) {
		for _, b := range all {
			if strings.HasPrefix(b.ID, strings.ToLower(ref)) {
				hits = append(hits, b)
			}
		}
	}
	if u, err := ParseUUID(ref); err == nil && len(hits) == 0 {
		for _, b := range all {
			if b.Header.AFUID == u {
				hits = append(hits, b)
			}
		}
	}
	switch len(hits) {
	case 0:
		return Bitstream{}, fmt.Errorf("%w: %q", ErrNotFound, ref)
	case 1:
		return hits[0], nil
	}
	return Bitstream{}, fmt.Errorf("%w: %q matches %d bitstreams", ErrAmbiguous, ref, len(hits))
}

func isHex(s string) bool {
	for _, c := range s {
		if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
			return false
		}
	}
	return true
}

// Remove deletes the bitstream a reference resolves to.
func (l *Library) Remove(ref string) (Bitstream, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	all, err := l.listLocked()
	if err != nil {
		return Bitstream{}, err
	}
	b, err := Resolve(all, ref)
	if err != nil {
		return Bitstream{}, err
	}
	if err := os.Remove(l.indexPath(b.ID)); err != nil {
		return Bitstream{}, fmt.Errorf("remove bitstream: %w", err)
	}
	l.cache = slices.DeleteFunc(l.cache, func(e Bitstream) bool { return e.ID == b.ID })
	if err := os.Remove(b.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return Bitstream{}, fmt.Errorf("remove bitstream: %w", err)
	}
	l.log.Info("bitstream removed", "id", b.ID, "name", b.Name)
	return b, nil
}

// validID reports whether id is a lower-case hex sha256.
func validID(id string) bool {
	if len(id) != 64 {
		return false
	}
	for _, c := range id {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
