package api

import "testing"

func TestUserName(t *testing.T) {
	for _, c := range []struct {
		uid  uint32
		user string
		want string
	}{{1000, "alice", "alice"}, {1000, "", "uid 1000"}, {0, "", "uid 0"}} {
		if got := UserName(c.uid, c.user); got != c.want {
			t.Errorf("UserName(%d, %q) = %q, want %q", c.uid, c.user, got, c.want)
		}
	}
}
