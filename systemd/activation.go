package systemd

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/coreos/go-systemd/v22/activation"
)

// ErrActivation is wrapped by every error about sockets systemd passed
// that fusiond cannot use.
var ErrActivation = errors.New("socket activation")

// Listener returns the API listener systemd passed to this process
// (LISTEN_FDS, from fusiond.socket), or nil and no error when the process
// was not socket-activated and must open socketPath itself. It clears the
// LISTEN_* variables so that processes fusiond starts do not see them.
//
// Exactly one Unix stream socket bound to socketPath is accepted: a
// different path means the socket unit and the configuration disagree,
// and serving anyway would leave clients that read the configuration
// knocking on the wrong door.
func Listener(socketPath string) (net.Listener, error) {
	return listenerFrom(activation.Files(true), socketPath)
}

func listenerFrom(files []*os.File, socketPath string) (net.Listener, error) {
	if len(files) == 0 {
		return nil, nil
	}
	defer func() {
		for _, f := range files {
			f.Close() // net.FileListener dups the descriptor it keeps
		}
	}()
	if len(files) != 1 {
		return nil, fmt.Errorf("%w: systemd passed %d sockets, fusiond serves exactly one (check fusiond.socket)", ErrActivation, len(files))
	}
	ln, err := net.FileListener(files[0])
	if err != nil {
		return nil, fmt.Errorf("%w: descriptor %d is not a listening socket: %w", ErrActivation, files[0].Fd(), err)
	}
	addr, ok := ln.Addr().(*net.UnixAddr)
	if !ok || addr.Net != "unix" {
		ln.Close()
		return nil, fmt.Errorf("%w: systemd passed a %s socket at %s, fusiond serves a Unix stream socket", ErrActivation, ln.Addr().Network(), ln.Addr())
	}
	if addr.Name != socketPath {
		ln.Close()
		return nil, fmt.Errorf("%w: fusiond.socket listens on %s but the configuration says socket: %s; make them agree", ErrActivation, addr.Name, socketPath)
	}
	return ln, nil
}
