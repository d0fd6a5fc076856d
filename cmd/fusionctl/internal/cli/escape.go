package cli

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// A job's name, command, working directory, labels and environment, a
// failure reason that quotes them, a bitstream's name, a peer's name:
// strings that a user or a peer chose reach the terminal through the
// tables. Two layers keep them from driving it:
//   - esc, on every such field, makes every control character visible
//     (tab and newline too, so that a field can neither start a row of its
//     own nor shift the columns), and the invisible Unicode formatting
//     characters that reorder text (bidi overrides) as well;
//   - escapeWriter, under every human-readable output, makes visible any
//     control character other than newline and tab that a field missed,
//     so that no escape sequence (ESC, CSI, OSC … BEL) reaches the
//     terminal whatever a table prints.
// JSON and YAML are left alone: their encoders escape what they must,
// and programs read them.

// esc returns s with control characters, bidi formatting characters and
// invalid UTF-8 written as Go escapes (\x1b, \n, \u202e, \xff); other
// text is unchanged.
func esc(s string) string {
	if !needsEscape(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case !unsafeRune(r, n):
			b.WriteString(s[i : i+n])
		case r == utf8.RuneError:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		default: // C1 or bidi
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		i += n
	}
	return b.String()
}

func needsEscape(s string) bool {
	for i := 0; i < len(s); {
		if c := s[i]; c >= 0x20 && c < 0x7f { // printable ASCII, most of it
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if unsafeRune(r, n) {
			return true
		}
		i += n
	}
	return false
}

// unsafeRune is a rune (of n bytes) that esc writes as an escape: a
// control character, C1, a bidi formatting character, or a byte of
// invalid UTF-8.
func unsafeRune(r rune, n int) bool {
	return (r == utf8.RuneError && n <= 1) || r < 0x20 || r == 0x7f || isC1(r) || isBidi(r)
}

// isC1 is the C1 control range (U+0080..U+009F): U+009B is CSI, U+009D
// OSC to terminals that take 8-bit controls.
func isC1(r rune) bool { return r >= 0x80 && r <= 0x9f }

// isBidi is the Unicode formatting characters that reorder what follows
// them (embeddings, overrides, isolates, marks).
func isBidi(r rune) bool {
	return (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) || r == 0x200e || r == 0x200f || r == 0x061c
}

// escapeWriter passes newline and tab and makes every other control
// character visible (\x1b, \x07, \u009b), bidi formatting characters
// and invalid UTF-8 too. A UTF-8 sequence that a write ends in the middle
// of is held back for the next write (a log stream is cut anywhere);
// Flush writes what is held.
type escapeWriter struct {
	w     io.Writer
	carry []byte
}

func newEscapeWriter(w io.Writer) *escapeWriter { return &escapeWriter{w: w} }

func (e *escapeWriter) Write(p []byte) (int, error) {
	n := len(p)
	if len(e.carry) > 0 {
		p = append(e.carry, p...)
		e.carry = nil
	}
	// Hold back an incomplete sequence at the end (at most 3 bytes).
	for i := len(p) - 1; i >= 0 && i >= len(p)-utf8.UTFMax+1; i-- {
		if utf8.RuneStart(p[i]) {
			if !utf8.FullRune(p[i:]) {
				e.carry = append([]byte(nil), p[i:]...)
				p = p[:i]
			}
			break
		}
	}
	if err := e.put(string(p)); err != nil {
		return 0, err
	}
	return n, nil
}

// Flush writes a held incomplete sequence, escaped (the stream ended in
// the middle of it).
func (e *escapeWriter) Flush() error {
	s := string(e.carry)
	e.carry = nil
	return e.put(s)
}

func (e *escapeWriter) put(s string) error {
	if !needsEscape(s) {
		_, err := io.WriteString(e.w, s)
		return err
	}
	var b strings.Builder
	start := 0
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == '\n' || r == '\t' || !unsafeRune(r, n) {
			i += n
			continue
		}
		b.WriteString(s[start:i])
		b.WriteString(esc(s[i : i+n]))
		i += n
		start = i
	}
	b.WriteString(s[start:])
	_, err := io.WriteString(e.w, b.String())
	return err
}
