package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/user"
	"strconv"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/fusiond/fusiond/daemon/api"
)

type callerKey struct{}

// WithCaller returns ctx carrying c (or the error that kept it from being
// known).
func withCaller(ctx context.Context, c api.Caller, err error) context.Context {
	return context.WithValue(ctx, callerKey{}, callerOrErr{c, err})
}

type callerOrErr struct {
	c   api.Caller
	err error
}

// CallerFrom returns the identity the connection's peer credentials gave.
func CallerFrom(ctx context.Context) (api.Caller, error) {
	v, ok := ctx.Value(callerKey{}).(callerOrErr)
	if !ok {
		return api.Caller{}, errors.New("no peer credentials on this connection")
	}
	return v.c, v.err
}

// peerCredentials reads SO_PEERCRED (uid, gid, pid) and SO_PEERGROUPS (the
// supplementary groups at connect time) from a Unix socket connection.
func peerCredentials(conn net.Conn) (api.Caller, error) {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return api.Caller{}, fmt.Errorf("connection is %T, not a Unix socket: no peer credentials", conn)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return api.Caller{}, err
	}
	var cred *unix.Ucred
	var groups []uint32
	var credErr, groupsErr error
	err = raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		groups, groupsErr = peerGroups(int(fd))
	})
	if err != nil {
		return api.Caller{}, err
	}
	if credErr != nil {
		return api.Caller{}, fmt.Errorf("SO_PEERCRED: %w", credErr)
	}
	if groupsErr != nil {
		return api.Caller{}, fmt.Errorf("SO_PEERGROUPS: %w", groupsErr)
	}
	return api.Caller{UID: cred.Uid, GID: cred.Gid, PID: cred.Pid, Groups: groups}, nil
}

func peerGroups(fd int) ([]uint32, error) {
	buf := make([]uint32, 64)
	for {
		size := uint32(len(buf) * 4)
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0)
		switch errno {
		case 0:
			return buf[:size/4], nil
		case unix.ERANGE:
			buf = make([]uint32, size/4+1)
		default:
			return nil, errno
		}
	}
}

// userNames caches uid → user name lookups.
type userNames struct {
	mu    sync.Mutex
	names map[uint32]string
}

func (u *userNames) name(uid uint32) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	if n, ok := u.names[uid]; ok {
		return n
	}
	n := ""
	if usr, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
		n = usr.Username
	}
	if n == "" {
		return n // not cached: the user may be created later
	}
	if u.names == nil {
		u.names = map[uint32]string{}
	}
	u.names[uid] = n
	return n
}
