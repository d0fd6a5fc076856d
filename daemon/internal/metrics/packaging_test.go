package metrics

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// The dashboard and alert rules the packages install under
// /usr/share/fusiond/ (packaging/nfpm.yaml).
const (
	dashboardFile = "../../../packaging/grafana/fusiond-dashboard.json"
	alertsFile    = "../../../packaging/prometheus/fusiond-alerts.yml"
	alertsTest    = "../../../packaging/prometheus/fusiond-alerts_test.yml"
)

// exported is every series name the daemon's registry produces once every
// source reports (histograms as their _bucket, _sum and _count series).
func exported(t *testing.T) map[string]bool {
	t.Helper()
	m := testMetrics(t)
	exercise(m)
	fams, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range fams {
		n := f.GetName()
		names[n] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[n+s] = true
			}
		}
	}
	return names
}

var metricName = regexp.MustCompile(`\bfusiond_[a-z0-9_]+`)

// unknownMetrics lists the fusiond_ names expr uses that the daemon does
// not export.
func unknownMetrics(expr string, names map[string]bool) []string {
	var bad []string
	for _, n := range metricName.FindAllString(expr, -1) {
		if !names[n] {
			bad = append(bad, n)
		}
	}
	return bad
}

func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (Debian package prometheus; make deps installs it): %v", err)
	}
	return p
}

type dashPanel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos struct {
		X, Y, W, H int
	} `json:"gridPos"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

// TestDashboard checks the Grafana dashboard's shape and that every query
// names metrics the daemon exports and parses as PromQL (each becomes a
// recording rule that promtool checks).
func TestDashboard(t *testing.T) {
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title         string      `json:"title"`
		UID           string      `json:"uid"`
		SchemaVersion int         `json:"schemaVersion"`
		Panels        []dashPanel `json:"panels"`
		Templating    struct {
			List []struct {
				Name string `json:"name"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("dashboard is not JSON: %v", err)
	}
	if d.Title == "" || d.UID == "" || len(d.UID) > 40 || d.SchemaVersion < 30 || len(d.Panels) < 10 {
		t.Fatalf("dashboard title %q uid %q schemaVersion %d, %d panels", d.Title, d.UID, d.SchemaVersion, len(d.Panels))
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	for _, v := range []string{"datasource", "instance", "job"} {
		if !vars[v] {
			t.Errorf("dashboard lacks the $%s variable", v)
		}
	}
	names := exported(t)
	names["up"] = true
	ids := map[int]bool{}
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	seen := map[string]bool{}
	for _, p := range d.Panels {
		where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if p.ID <= 0 || ids[p.ID] {
			t.Errorf("%s: id missing or repeated", where)
		}
		ids[p.ID] = true
		if p.Title == "" || p.GridPos.W < 1 || p.GridPos.X < 0 || p.GridPos.X+p.GridPos.W > 24 || p.GridPos.H < 1 {
			t.Errorf("%s: title or gridPos %+v out of Grafana's 24-column grid", where, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if !slices.Contains([]string{"timeseries", "stat", "gauge", "table", "bargauge"}, p.Type) {
			t.Errorf("%s: unexpected panel type %q", where, p.Type)
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("%s: datasource must be the $datasource variable", where)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no queries", where)
		}
		refs := map[string]bool{}
		for _, q := range p.Targets {
			if q.Expr == "" || q.RefID == "" || refs[q.RefID] {
				t.Errorf("%s: query %q with refId %q", where, q.Expr, q.RefID)
			}
			refs[q.RefID] = true
			if bad := unknownMetrics(q.Expr, names); len(bad) > 0 {
				t.Errorf("%s: query %q names metrics fusiond does not export: %v", where, q.Expr, bad)
			}
			for _, n := range metricName.FindAllString(q.Expr, -1) {
				seen[n] = true
			}
			expr := strings.NewReplacer("$__rate_interval", "5m", "$instance", ".*", "$job", "fusiond").Replace(q.Expr)
			js, _ := json.Marshal(expr)
			fmt.Fprintf(&rules, "      - record: dashboard:panel%d:%s\n        expr: %s\n", p.ID, q.RefID, js)
		}
	}
	// The families an operator needs first are on it.
	for _, n := range []string{"fusiond_jobs", "fusiond_queue_wait_seconds_bucket", "fusiond_placement_decision_duration_seconds_bucket",
		"fusiond_api_request_duration_seconds_bucket", "fusiond_gpu_utilization_ratio", "fusiond_device_healthy",
		"fusiond_mig_instance_healthy", "fusiond_fpga_region_programmed", "fusiond_tier_cpu_seconds_total"} {
		if !seen[n] {
			t.Errorf("no dashboard panel shows %s", n)
		}
	}
	file := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(file, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool(t), "check", "rules", file).CombinedOutput(); err != nil {
		t.Errorf("dashboard queries are not valid PromQL: %v\n%s\n%s", err, out, rules.String())
	}
}

// TestAlertRules: promtool accepts the rules, their unit tests pass (the
// alerts fire when they should, with the annotations they should), and
// every metric they use is exported.
func TestAlertRules(t *testing.T) {
	pt := promtool(t)
	if out, err := exec.Command(pt, "check", "rules", alertsFile).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules: %v\n%s", err, out)
	}
	cmd := exec.Command(pt, "test", "rules", filepath.Base(alertsTest))
	cmd.Dir = filepath.Dir(alertsTest)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool test rules: %v\n%s", err, out)
	}
	data, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	names := exported(t)
	var alerts []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if a, ok := strings.CutPrefix(line, "- alert: "); ok {
			alerts = append(alerts, a)
		}
		if e, ok := strings.CutPrefix(line, "expr: "); ok {
			if bad := unknownMetrics(e, names); len(bad) > 0 {
				t.Errorf("alert expr %q names metrics fusiond does not export: %v", e, bad)
			}
		}
	}
	for _, want := range []string{"FusiondDown", "FusiondGPUUnhealthy", "FusiondQueueWaitHigh", "FusiondQoSSLOBreached"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("no %s alert (have %v)", want, alerts)
		}
	}
}
