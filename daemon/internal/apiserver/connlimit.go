package apiserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// The connection limits' names, as the configuration spells them.
const (
	LimitConnections        = "limits.connections"
	LimitUserConnections    = "limits.per_user.connections"
	LimitMetricsConnections = "metrics.max_connections"
)

// ConnLimits bound the connections a listener keeps open. 0 disables a
// limit.
type ConnLimits struct {
	// Total is the most connections open at once, every user's together;
	// admins (root, the daemon's own user, the admin group) have Reserve
	// more beyond it, so they can always connect.
	Total, Reserve int
	// PerUser is the most connections one uid keeps open; admins are not
	// held to it (Total and Reserve bound them).
	PerUser int
	// TotalLimit names Total in refusals (LimitConnections, or the
	// metrics listener's own).
	TotalLimit string
}

// LimitListener wraps ln so that it keeps to lim: a connection beyond a
// limit is answered at once with 429 naming the limit and closed, so that
// one user's idle connections can neither exhaust the daemon's file
// descriptors nor keep another user out. identify tells who is on the
// other end (nil: nobody is known, only Total applies). The connections it
// returns carry that identity for ConnContext.
func LimitListener(ln net.Listener, lim ConnLimits, identify func(net.Conn) (api.Caller, error), log *slog.Logger) *LimitedListener {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &LimitedListener{Listener: ln, lim: lim, identify: identify, log: log, perUID: map[uint32]int{}, warned: map[uint32]time.Time{}}
}

// LimitedListener is LimitListener's listener.
type LimitedListener struct {
	net.Listener
	lim      ConnLimits
	identify func(net.Conn) (api.Caller, error)
	log      *slog.Logger

	mu      sync.Mutex
	total   int
	perUID  map[uint32]int
	refused uint64
	warned  map[uint32]time.Time // last refusal logged, per uid
}

// Accept returns the next connection within the limits; the ones beyond
// them are refused and closed meanwhile.
func (l *LimitedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		var caller api.Caller
		var idErr error
		known := false
		if l.identify != nil {
			caller, idErr = l.identify(c)
			known = idErr == nil
		}
		if why, limit := l.admit(caller, known); why != "" {
			l.refuse(c, caller, known, why, limit)
			continue
		}
		return &limitedConn{Conn: c, l: l, caller: caller, known: known, idErr: idErr}, nil
	}
}

// admit counts a new connection, or says which limit it is beyond.
func (l *LimitedListener) admit(c api.Caller, known bool) (why, limit string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	admin := known && c.Admin
	switch {
	case l.lim.Total > 0 && !admin && l.total >= l.lim.Total:
		return fmt.Sprintf("the daemon has %d connections open, the most allowed", l.total), l.lim.TotalLimit
	case l.lim.Total > 0 && admin && l.total >= l.lim.Total+l.lim.Reserve:
		return fmt.Sprintf("the daemon has %d connections open, its admins' reserve included", l.total), l.lim.TotalLimit
	case l.lim.PerUser > 0 && known && !admin && l.perUID[c.UID] >= l.lim.PerUser:
		return fmt.Sprintf("uid %d has %d connections open, the most allowed", c.UID, l.perUID[c.UID]), LimitUserConnections
	}
	l.total++
	if known {
		l.perUID[c.UID]++
	}
	return "", ""
}

func (l *LimitedListener) release(c api.Caller, known bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if known {
		if l.perUID[c.UID]--; l.perUID[c.UID] <= 0 {
			delete(l.perUID, c.UID)
		}
	}
}

// refuse answers c with 429 naming the limit and closes it. The answer is
// written without waiting for the request (a client that sent one reads
// the answer; one that sent nothing reads it when it does), within a short
// deadline, so that a client that never reads cannot hold the accept loop.
func (l *LimitedListener) refuse(c net.Conn, caller api.Caller, known bool, why, limit string) {
	body, _ := json.Marshal(api.QuotaError(limit, "%s", why))
	c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	fmt.Fprintf(c, "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	c.Close()
	l.mu.Lock()
	l.refused++
	n := l.refused
	// One log line per uid (all unknown callers share uid 0's slot) every
	// 10 s at most: a flood does not flood the log.
	uid := uint32(0)
	if known {
		uid = caller.UID
	}
	logIt := time.Since(l.warned[uid]) > 10*time.Second
	if logIt {
		if len(l.warned) > 1024 {
			clear(l.warned)
		}
		l.warned[uid] = time.Now()
	}
	l.mu.Unlock()
	if logIt {
		who := "an unidentified client"
		if known {
			who = "uid " + strconv.FormatUint(uint64(caller.UID), 10)
		}
		l.log.Warn("connection refused", "who", who, "why", why, "limit", limit, "refused_total", n)
	}
}

// Open returns the connections open in all and per uid, and how many
// were refused since the start.
func (l *LimitedListener) Open() (total int, perUID map[uint32]int, refused uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	perUID = make(map[uint32]int, len(l.perUID))
	for k, v := range l.perUID {
		perUID[k] = v
	}
	return l.total, perUID, l.refused
}

// limitedConn is an admitted connection: Close gives its place back once.
type limitedConn struct {
	net.Conn
	l      *LimitedListener
	caller api.Caller
	known  bool
	idErr  error
	once   sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.caller, c.known) })
	return err
}

// identified returns the identity LimitListener found for c, if c is one
// of its connections.
func identified(c net.Conn) (api.Caller, error, bool) {
	lc, ok := c.(*limitedConn)
	if !ok {
		return api.Caller{}, nil, false
	}
	if !lc.known {
		if lc.idErr == nil {
			lc.idErr = errors.New("no peer credentials on this connection")
		}
		return api.Caller{}, lc.idErr, true
	}
	return lc.caller, nil, true
}
