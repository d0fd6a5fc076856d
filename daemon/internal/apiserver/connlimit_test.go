package apiserver

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fusiond/fusiond/daemon/api"
)

// TestLimitListener: per-user and total limits, the admins' reserve, a
// refusal that says which limit, and a closed connection giving its place
// back.
func TestLimitListener(t *testing.T) {
	raw, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	// Who connects next is what the test says (every connection of this
	// process has the same peer credentials).
	next := make(chan api.Caller, 1)
	identify := func(net.Conn) (api.Caller, error) {
		c := <-next
		if c.UID == 99 {
			return api.Caller{}, errors.New("unidentified")
		}
		return c, nil
	}
	ln := LimitListener(raw, ConnLimits{Total: 4, Reserve: 1, PerUser: 2, TotalLimit: LimitConnections}, identify, nil)
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	alice, bob, root := api.Caller{UID: 1000}, api.Caller{UID: 1001}, api.Caller{UID: 0, Admin: true}
	// dial connects as who: it returns the server side when admitted, or
	// the refusal the client reads.
	var clients []net.Conn
	dial := func(who api.Caller) (net.Conn, string) {
		t.Helper()
		next <- who
		c, err := net.Dial("unix", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
		select {
		case s := <-accepted:
			return s, ""
		case <-time.After(200 * time.Millisecond):
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("neither admitted nor refused: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("refusal status %d", resp.StatusCode)
		}
		return nil, string(body)
	}
	a1, _ := dial(alice)
	dial(alice)
	if _, why := dial(alice); !strings.Contains(why, `"limit":"limits.per_user.connections"`) || !strings.Contains(why, "uid 1000 has 2 connections open") {
		t.Errorf("alice's third connection: %q", why)
	}
	if s, why := dial(bob); s == nil {
		t.Fatalf("bob refused: %s", why)
	}
	anon, why := dial(api.Caller{UID: 99}) // unidentified: the total alone
	if anon == nil {
		t.Fatalf("unidentified refused: %s", why)
	}
	if _, why := dial(bob); !strings.Contains(why, `"limit":"limits.connections"`) || !strings.Contains(why, "the daemon has 4 connections open") {
		t.Errorf("fifth connection: %q", why)
	}
	if s, why := dial(root); s == nil {
		t.Fatalf("root refused within the reserve: %s", why)
	}
	if _, why := dial(root); !strings.Contains(why, "admins' reserve included") {
		t.Errorf("root beyond the reserve: %q", why)
	}
	a1.Close()
	a1.Close() // twice gives back one place
	total, per, refused := ln.Open()
	if total != 4 || per[1000] != 1 || per[1001] != 1 || per[0] != 1 || refused != 3 {
		t.Errorf("open %d %v, refused %d; want 4, alice 1 bob 1 root 1, 3 refused", total, per, refused)
	}
	if _, why := dial(alice); !strings.Contains(why, `"limit":"limits.connections"`) {
		t.Errorf("alice within her limit but the node full: %q", why)
	}
	anon.Close()
	if s, why := dial(alice); s == nil {
		t.Errorf("alice refused after a place was given back: %s", why)
	}
	for _, c := range clients {
		c.Close()
	}
}
