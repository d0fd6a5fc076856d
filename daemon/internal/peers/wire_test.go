package peers

import (
	"strings"
	"testing"
)

// Gossip from a newer daemon (a load field this version does not know) is
// read, so a cluster upgrades one daemon at a time; an offer with a field
// this version does not know is refused, so no job runs without part of
// its spec.
func TestGossipToleratesNewFieldsOffersDoNot(t *testing.T) {
	load := append([]byte{kindLoad}, `{"node":"b","load":{"cpu":"1","health":"ok","future_field":[1,2]},"added_later":true}`...)
	m, err := decodeLoad(load)
	if err != nil {
		t.Fatalf("load with fields of a newer daemon: %v", err)
	}
	if m.Node != "b" {
		t.Errorf("load decoded as %+v, want node b", m)
	}
	state := append([]byte{kindState}, `[{"node":"c","added_later":1}]`...)
	if loads, err := decodeState(state); err != nil || len(loads) != 1 || loads[0].Node != "c" {
		t.Errorf("state with fields of a newer daemon: %v %+v", err, loads)
	}
	if _, err := decodeMeta([]byte(`{"added_later":"x"}`)); err != nil {
		t.Errorf("metadata with a field of a newer daemon: %v", err)
	}
	_, err = decodeOffer([]byte(`{"key":"a/1#1","user":"nobody","spec":{"name":"x"},"added_later":true}`))
	if err == nil || !strings.Contains(err.Error(), "added_later") {
		t.Errorf("offer with an unknown field: err %v, want it refused naming the field", err)
	}
}
