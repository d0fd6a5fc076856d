package bitstream

import (
	"encoding/hex"
	"fmt"
	"strings"
)

// UUID is a 16-byte identifier in the byte order its textual form is
// written in (the order sysfs prints afu_id, compat_id, xclbinuuid and
// interface_uuids, and the order GBS JSON metadata spells them).
type UUID [16]byte

// IsZero reports whether u is all zero, i.e. unknown.
func (u UUID) IsZero() bool { return u == UUID{} }

// String is the canonical 8-4-4-4-12 lower-case form.
func (u UUID) String() string {
	h := hex.EncodeToString(u[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// Hex is the 32-digit form without dashes that sysfs attributes use.
func (u UUID) Hex() string { return hex.EncodeToString(u[:]) }

// MarshalText implements encoding.TextMarshaler.
func (u UUID) MarshalText() ([]byte, error) {
	if u.IsZero() {
		return []byte{}, nil
	}
	return []byte(u.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (u *UUID) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*u = UUID{}
		return nil
	}
	v, err := ParseUUID(string(b))
	if err != nil {
		return err
	}
	*u = v
	return nil
}

// ParseUUID accepts the dashed form, the 32-digit form without dashes, an
// optional 0x prefix and surrounding white space, in any letter case.
func ParseUUID(s string) (UUID, error) {
	var u UUID
	t := strings.TrimSpace(s)
	t = strings.TrimPrefix(strings.TrimPrefix(t, "0x"), "0X")
	t = strings.ReplaceAll(t, "-", "")
	if len(t) != 32 {
		return u, fmt.Errorf("%w: %q is not a 128-bit identifier", ErrMalformed, s)
	}
	if _, err := hex.Decode(u[:], []byte(t)); err != nil {
		return u, fmt.Errorf("%w: %q: %v", ErrMalformed, s, err)
	}
	return u, nil
}
