package deploy

import (
	"os"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"sigs.k8s.io/yaml"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/metricsenv"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics/dispatchmetrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/webhook"
)

// rulesFile is the PrometheusRule shipped in deploy/.
const rulesFile = "prometheus/gitea-dynamic-runner-rules.yaml"

// The PrometheusRule is one of the Prometheus Operator's kind, its groups
// load as Prometheus loads a rule file (rulefmt: every expression parses,
// every field is known, every alert named), every metric an expression
// names is one the components export (or one of externalMetrics), and it
// holds the alerts docs/OPERATIONS.md describes.
func TestPrometheusRule(t *testing.T) {
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name   string            `json:"name"`
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
		Spec struct {
			Groups []any `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(data, &rule); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	if rule.APIVersion != "monitoring.coreos.com/v1" || rule.Kind != "PrometheusRule" || rule.Metadata.Name == "" {
		t.Fatalf("%s: %s %s %q, want a named monitoring.coreos.com/v1 PrometheusRule", rulesFile, rule.APIVersion, rule.Kind, rule.Metadata.Name)
	}
	groups, err := yaml.Marshal(map[string]any{"groups": rule.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	parsed, errs := rulefmt.Parse(groups, false, model.UTF8Validation)
	for _, err := range errs {
		t.Errorf("%s: %v", rulesFile, err)
	}
	if parsed == nil {
		t.FailNow()
	}
	exported := exportedMetrics(t)
	var alerts []string
	for _, g := range parsed.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			names := metricNames(t, r.Expr)
			if len(names) == 0 {
				t.Errorf("%s: %s queries no metric", rulesFile, r.Alert)
			}
			for _, n := range names {
				if !exported[n] && externalMetrics[n] == "" {
					t.Errorf("%s: %s queries %s, which no component exports", rulesFile, r.Alert, n)
				}
			}
		}
	}
	for _, want := range []string{"GDRQueueNotConsumed", "GDRPoolFull", "GDRAssignmentsRedelivered", "GDRAssignmentsPoison", "GDRDispatchClaimErrors", "GDRGatewayErrors", "GDRConsumerUnreadable", "GDRSlowPickup", "GDRDispatchAbsent", "GDRGatewayAbsent"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("%s lacks the alert %s", rulesFile, want)
		}
	}
}

// externalMetrics are the metrics the rules query that no component of ours exports, and
// who does: docs/OPERATIONS.md ("Metrics") says which scrape each needs.
var externalMetrics = map[string]string{
	"up": "Prometheus, for each target it scrapes",
	// KEDA's operator v2.21.0 (pkg/metricscollector/prommetrics.go); kedaenv's
	// TestE2EOperatorExportsScalerActive reads them from the running operator.
	"keda_scaler_active":        "KEDA's operator",
	"keda_scaled_object_paused": "KEDA's operator",
	// The Pushgateway's own series of each group pushed to it (the short-lived runs'
	// metrics.PushSettings).
	"push_time_seconds": "the Pushgateway",
}

// GDRSlowPickup's expression, evaluated by Prometheus' engine over a pool's
// jobs scraped every minute for 20 minutes, returns the pool when its jobs
// take longer than the threshold from the push to their first step, and
// nothing when they are quick or when no job completed at all.
func TestSlowPickupAlert(t *testing.T) {
	expr := alertExpr(t, "GDRSlowPickup")
	for _, tc := range []struct {
		name     string
		toFirst  time.Duration // each job's push -> running
		jobs     int           // jobs completed a minute
		wantPool bool
	}{
		{"slow", 200 * time.Second, 3, true},
		{"just over", 150 * time.Second, 3, true},
		{"quick", 10 * time.Second, 3, false},
		{"no jobs", 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := metrics.NewRegistry()
			jobs := dispatchmetrics.NewJobs(reg, []runnerpool.Pool{{Name: "linux", Labels: []string{"linux"}}})
			start := time.Now()
			var scrapes []scraped
			for minute := range 21 {
				at := start.Add(time.Duration(minute) * time.Minute)
				for range tc.jobs {
					jobs.Delivered(webhook.Job{Action: webhook.ActionCompleted, Labels: []string{"linux"}, Conclusion: "success",
						CreatedAt: at.Add(-tc.toFirst), FirstStepAt: at})
				}
				scrapes = append(scrapes, scraped{at: at, fams: metricsenv.Gather(t, reg)})
			}
			v := evaluate(t.Context(), t, storeScrapes(t, scrapes), expr, scrapes[len(scrapes)-1].at)
			if fired := len(v) == 1 && v[0].Metric.Get("pool") == "linux"; fired != tc.wantPool || (!tc.wantPool && len(v) != 0) {
				t.Errorf("%s over push -> running of %v: %v; want the pool: %v", expr, tc.toFirst, v, tc.wantPool)
			}
		})
	}
}

// alertExpr is the expression of the shipped rule file's alert name.
func alertExpr(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert string `json:"alert"`
					Expr  string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &rule); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == name {
				return r.Expr
			}
		}
	}
	t.Fatalf("%s has no alert %s", rulesFile, name)
	return ""
}
