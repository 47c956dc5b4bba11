package deploy

import (
	"os"
	"slices"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"sigs.k8s.io/yaml"
)

// rulesFile is the PrometheusRule shipped in deploy/.
const rulesFile = "prometheus/gitea-dynamic-runner-rules.yaml"

// The PrometheusRule is one of the Prometheus Operator's kind, its groups
// load as Prometheus loads a rule file (rulefmt: every expression parses,
// every field is known, every alert named), every metric an expression
// names is one the components export, and it holds the alerts
// docs/OPERATIONS.md describes.
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
				if !exported[n] {
					t.Errorf("%s: %s queries %s, which no component exports", rulesFile, r.Alert, n)
				}
			}
		}
	}
	for _, want := range []string{"GDRQueueNotConsumed", "GDRPoolFull", "GDRAssignmentsRedelivered", "GDRAssignmentsPoison", "GDRDispatchClaimErrors", "GDRGatewayErrors", "GDRConsumerUnreadable"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("%s lacks the alert %s", rulesFile, want)
		}
	}
}
