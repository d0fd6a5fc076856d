package peers

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/memberlist"
)

// The gossip keyring file holds one base64 AES key (16, 24 or 32 bytes)
// per line, the primary (the one messages are encrypted with) first;
// every key decrypts. fusionctl peers keyring install|use|remove change
// the live keyring and write the file back, so a restart keeps them.

func readKeyring(path string) ([][]byte, error) {
	if err := checkSecret(path, "gossip keyring"); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("gossip keyring: %w", err)
	}
	var keys [][]byte
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, err := decodeKey(line)
		if err != nil {
			return nil, fmt.Errorf("gossip keyring %s line %d: %w", path, i+1, err)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("gossip keyring %s holds no key", path)
	}
	return keys, nil
}

func decodeKey(s string) ([]byte, error) {
	k, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("not base64: %w", err)
	}
	switch len(k) {
	case 16, 24, 32:
		return k, nil
	}
	return nil, fmt.Errorf("a key is 16, 24 or 32 bytes (AES-128/192/256), got %d", len(k))
}

func writeKeyring(path string, keys [][]byte) error {
	var b strings.Builder
	b.WriteString("# fusiond gossip keyring: the primary key first\n")
	for _, k := range keys {
		b.WriteString(base64.StdEncoding.EncodeToString(k) + "\n")
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".keyring-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(b.String()); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func fingerprint(k []byte) string {
	s := sha256.Sum256(k)
	return hex.EncodeToString(s[:4])
}

func fingerprints(kr *memberlist.Keyring) []string {
	if kr == nil {
		return nil
	}
	var out []string
	for _, k := range kr.GetKeys() { // primary first
		out = append(out, fingerprint(k))
	}
	return out
}

// keyringOp applies one operation to the live keyring.
func keyringOp(kr *memberlist.Keyring, op, key string) error {
	if kr == nil {
		return errors.New("gossip encryption is off (no peers.keyring_file): there is no keyring to change")
	}
	k, err := decodeKey(key)
	if err != nil {
		return err
	}
	switch op {
	case "install":
		return kr.AddKey(k)
	case "use":
		return kr.UseKey(k)
	case "remove":
		return kr.RemoveKey(k)
	}
	return fmt.Errorf("unknown keyring operation %q (want install, use or remove)", op)
}
