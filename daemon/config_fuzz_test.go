package daemon

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/fusiond/fusiond/daemon/api"
)

// FuzzParseConfig: the configuration decoder never panics; a refusal is an
// error (a field-level one names the key), and an accepted configuration
// validates again after a round trip through its own JSON.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		"state_dir: /var/lib/fusiond\nsocket: /run/f.sock\n",
		"limits:\n  per_user:\n    pending_jobs: 10\n    streams: 2\n  log_budget: 1Gi\n  stream_idle_timeout: 5m\n",
		"limits:\n  per_user:\n    pending_jobs: -1\n",
		"tiers:\n  batch: gold\n", "log: {format: xml}\n", "cancel_grace: forever\n", "gpu: {health_probe: 1s}\n",
		"socket_mode: \"0999\"\n", "- a\n- b\n", "", "{", "retention: {max_finished_jobs: 1e99}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg := DefaultConfig()
		if err := ParseConfig(data, &cfg); err != nil {
			var e *api.Error
			if errors.As(err, &e) && e.Code == api.CodeInvalid && e.Field == "" && e.Message == "" {
				t.Fatalf("empty refusal: %v", err)
			}
			return
		}
		js, err := json.Marshal(cfg)
		if err != nil {
			t.Fatalf("accepted config does not encode: %v", err)
		}
		var again Config
		if err := json.Unmarshal(js, &again); err != nil {
			t.Fatalf("accepted config does not decode again: %v\n%s", err, js)
		}
		if err := again.Validate(); err != nil {
			t.Fatalf("accepted config is invalid after a round trip: %v", err)
		}
	})
}
