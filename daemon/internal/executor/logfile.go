package executor

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// DefaultLogMaxBytes caps a job's output.log before it is rotated.
const DefaultLogMaxBytes int64 = 64 << 20

// rotatingLog appends to a file and, when a write would take it past max
// bytes, renames it to path.1 (replacing an older one) and starts a new
// file. So a job's output takes at most about 2×max bytes of disk.
type rotatingLog struct {
	path string
	max  int64
	f    *os.File
	size int64
}

var _ io.WriteCloser = (*rotatingLog)(nil)

func openRotatingLog(path string, max int64) (*rotatingLog, error) {
	if max <= 0 {
		max = DefaultLogMaxBytes
	}
	l := &rotatingLog{path: path, max: max}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *rotatingLog) open() error {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("open log: %w", err)
	}
	l.f, l.size = f, st.Size()
	return nil
}

// rotate starts a new file. When the rename fails the original file is
// reopened (and kept growing), so the log stays writable.
func (l *rotatingLog) rotate() error {
	closeErr := l.f.Close()
	if err := os.Rename(l.path, l.path+".1"); err != nil && !errors.Is(err, os.ErrNotExist) {
		if openErr := l.open(); openErr != nil {
			return errors.Join(fmt.Errorf("rotate log: %w", err), openErr)
		}
		return fmt.Errorf("rotate log: %w", err)
	}
	if err := l.open(); err != nil {
		return err
	}
	if closeErr != nil {
		return fmt.Errorf("rotate log: close: %w", closeErr)
	}
	return nil
}

// Write appends p, rotating first when p would not fit. A single write
// larger than max is written whole to a fresh file.
func (l *rotatingLog) Write(p []byte) (int, error) {
	if l.size > 0 && l.size+int64(len(p)) > l.max {
		if err := l.rotate(); err != nil {
			return 0, err
		}
	}
	n, err := l.f.Write(p)
	l.size += int64(n)
	return n, err
}

func (l *rotatingLog) Close() error { return l.f.Close() }
