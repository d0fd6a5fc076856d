package devicefilter

import (
	"encoding/binary"
	"strings"
)

type nopWriter struct{ sb *strings.Builder }

func (w *nopWriter) Write(p []byte) (int, error) { return w.sb.Write(p) }

// nativeEndian is little endian: asm marshals only the two concrete orders
// and fusiond targets amd64/arm64.
func nativeEndian() binary.ByteOrder { return binary.LittleEndian }
