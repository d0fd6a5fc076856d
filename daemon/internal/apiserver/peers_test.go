package apiserver_test

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/apiserver"
)

type fakePeerBackend struct{ ops []api.KeyringRequest }

func (f *fakePeerBackend) Peers() api.PeerList {
	return api.PeerList{Enabled: true, Self: "a", Peers: []api.Peer{{Name: "a", Self: true, State: "alive"}}}
}

func (f *fakePeerBackend) Keyring(req api.KeyringRequest) (api.PeerList, error) {
	f.ops = append(f.ops, req)
	return f.Peers(), nil
}

func TestPeerRoutes(t *testing.T) {
	hc, _ := startServer(t)
	code, body := do(t, hc, "GET", "/v1/peers", "")
	var l api.PeerList
	if code != 200 || json.Unmarshal(body, &l) != nil || l.Enabled || l.Peers == nil {
		t.Fatalf("without peers: %d %s", code, body)
	}
	key := base64.StdEncoding.EncodeToString(make([]byte, 32))
	if code, body := do(t, hc, "POST", "/v1/peers/keyring", `{"op":"install","key":"`+key+`"}`); code != 409 {
		t.Errorf("keyring without peers: %d %s", code, body)
	}

	f := &fakePeerBackend{}
	hc, _, _ = startServerWith(t, nil, func(c *apiserver.Config) { c.Peers = f })
	if code, body := do(t, hc, "GET", "/v1/peers", ""); code != 200 || !strings.Contains(string(body), `"self": "a"`) {
		t.Errorf("peers: %d %s", code, body)
	}
	for _, tc := range []struct{ body, field string }{
		{`{"op":"rotate","key":"` + key + `"}`, "op"},
		{`{"op":"use","key":"not base64!"}`, "key"},
		{`{"op":"use","key":"` + base64.StdEncoding.EncodeToString([]byte("short")) + `"}`, "key"},
		{`{"op":"use","key":"` + key + `","extra":1}`, "extra"},
	} {
		code, body := do(t, hc, "POST", "/v1/peers/keyring", tc.body)
		var e api.Error
		json.Unmarshal(body, &e)
		if code != 422 || e.Field != tc.field {
			t.Errorf("%s: %d %s, want 422 about %s", tc.body, code, body, tc.field)
		}
	}
	if len(f.ops) != 0 {
		t.Fatalf("bad requests reached the keyring: %+v", f.ops)
	}
	if code, body := do(t, hc, "POST", "/v1/peers/keyring", `{"op":"use","key":"`+key+`"}`); code != 200 || len(f.ops) != 1 || f.ops[0].Op != "use" {
		t.Errorf("good request: %d %s, ops %+v", code, body, f.ops)
	}
}
