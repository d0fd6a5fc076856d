package peers

import (
	"encoding/base64"
	"strings"
	"testing"
)

// Gossip from a newer daemon (a load field this version does not know) is
// read, so a cluster upgrades one daemon at a time; an offer with a field
// this version does not know is refused, so no job runs without part of
// its spec.
func TestGossipToleratesNewFieldsOffersDoNot(t *testing.T) {
	body := `{"node":"b","seq":1,"load":{"cpu":"1","health":"ok","future_field":[1,2]},"added_later":true}`
	sig, _ := testSign([]byte(body))
	env := `{"body":` + body + `,"sig":"` + base64.StdEncoding.EncodeToString(sig) + `","added_later":1}`
	m, err := decodeLoad(append([]byte{kindLoad}, env...))
	if err != nil {
		t.Fatalf("load with fields of a newer daemon: %v", err)
	}
	if m.Node != "b" || !verifyLoad(testSigner.Public(), m.body, m.sig) {
		t.Errorf("load decoded as %+v (verifies: %v), want node b, verified", m, verifyLoad(testSigner.Public(), m.body, m.sig))
	}
	state := append([]byte{kindState}, `[`+env+`]`...)
	if loads, bad, err := decodeState(state); err != nil || bad != 0 || len(loads) != 1 || loads[0].Node != "b" {
		t.Errorf("state with fields of a newer daemon: %v %d %+v", err, bad, loads)
	}
	if _, err := decodeMeta([]byte(`{"added_later":"x"}`)); err != nil {
		t.Errorf("metadata with a field of a newer daemon: %v", err)
	}
	_, err = decodeOffer([]byte(`{"key":"a/1#1","user":"nobody","spec":{"name":"x"},"added_later":true}`))
	if err == nil || !strings.Contains(err.Error(), "added_later") {
		t.Errorf("offer with an unknown field: err %v, want it refused naming the field", err)
	}
}
