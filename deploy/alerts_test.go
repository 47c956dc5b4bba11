package deploy

import (
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/model/value"
	"sigs.k8s.io/yaml"
)

// timedSample is one sample of one series at one evaluation: its labels, as Prometheus stores
// them after the scrape, and its value.
type timedSample struct {
	labels map[string]string
	value  float64
}

// kedaTarget is the target labels of KEDA's operator as kube-prometheus-stack scrapes it
// through KEDA's chart's ServiceMonitor (prometheus.operator.serviceMonitor.enabled): the
// operator's namespace and Pod, no honorLabels.
var kedaTarget = map[string]string{"job": "keda-operator", "instance": "10.0.0.5:8080", "namespace": "keda", "pod": "keda-operator-7d9f"}

// kedaSeries is a series of KEDA's operator v2.21.0 (pkg/metricscollector/prommetrics.go:
// keda_scaler_active and keda_scaled_object_paused, gauges; the scaler's labels namespace,
// metric, scaledObject, scaler, triggerIndex, type) as Prometheus stores it from a scrape of
// the operator with the target labels kedaTarget: with honor (honor_labels) KEDA's namespace,
// the ScaledObject's, is kept; without, Prometheus keeps the target's and moves KEDA's to
// exported_namespace. kedaenv's TestE2EOperatorExportsScalerActive reads the same series from
// the running operator.
func kedaSeries(name string, own map[string]string, honor bool, v float64) timedSample {
	l := maps.Clone(kedaTarget)
	l[labels.MetricName] = name
	for k, val := range own {
		if _, clash := kedaTarget[k]; clash && !honor {
			l["exported_"+k] = val
			continue
		}
		l[k] = val
	}
	return timedSample{l, v}
}

// scalerActive is keda_scaler_active of trigger index of the ScaledObject so in namespace ns
// (1: its scaler sees work).
func scalerActive(ns, so string, index int, honor bool, active bool) timedSample {
	scaler, metric := "natsJetStreamScaler", "s0-nats-jetstream-CI_RUNNER"
	if index > 0 {
		scaler, metric = "metricsAPIScaler", "s1-metric-api-jobs"
	}
	v := 0.0
	if active {
		v = 1
	}
	return kedaSeries("keda_scaler_active", map[string]string{
		"namespace": ns, "scaledObject": so, "scaler": scaler, "triggerIndex": strconv.Itoa(index), "metric": metric, "type": "scaledobject",
	}, honor, v)
}

// targetUp is up of a Pod of component (dispatch, gateway) in namespace ns as the shipped
// PodMonitor (and deploy/README.md's scrape configuration) labels it: namespace, pod and
// component (the Pod's app.kubernetes.io/name).
func targetUp(ns, component string, v float64) timedSample {
	return timedSample{map[string]string{
		labels.MetricName: "up", "job": ns + "/gitea-dynamic-runner", "namespace": ns, "pod": component + "-5c8d7",
		"instance": "10.0.1.7:8080", "component": component,
	}, v}
}

// storeTimeline stores at(minute) for every minute up to minutes, as Prometheus stores a
// scrape a minute of every target: a series there one minute and gone the next gets a
// staleness marker, as Prometheus writes one when a series or its target disappears (a Pod
// scaled away), so nothing lingers for the lookback.
func storeTimeline(t *testing.T, start time.Time, minutes int, at func(minute int) []timedSample) *promStore {
	t.Helper()
	st := newPromStore()
	var before map[string]labels.Labels
	for m := 0; m <= minutes; m++ {
		ts := start.Add(time.Duration(m) * time.Minute).UnixMilli()
		now := map[string]labels.Labels{}
		for _, s := range at(m) {
			l := labels.FromMap(s.labels)
			now[l.String()] = l
			if err := st.add(l, ts, s.value); err != nil {
				t.Fatalf("store %s: %v", l, err)
			}
		}
		for k, l := range before {
			if _, ok := now[k]; !ok {
				if err := st.add(l, ts, math.Float64frombits(value.StaleNaN)); err != nil {
					t.Fatalf("stale %s: %v", l, err)
				}
			}
		}
		before = now
	}
	return st
}

// alertRule is an alert of the shipped rule file as Prometheus loads it (rulefmt).
type alertRule struct {
	name string
	expr string
	hold time.Duration // for
}

// shippedAlert is the shipped rule file's alert name, parsed as Prometheus parses the file.
func shippedAlert(t *testing.T, name string) alertRule {
	t.Helper()
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Spec struct {
			Groups []any `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	groups, err := yaml.Marshal(map[string]any{"groups": file.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	parsed, errs := rulefmt.Parse(groups, false, model.UTF8Validation)
	if len(errs) > 0 {
		t.Fatalf("%s: %v", rulesFile, errs)
	}
	for _, g := range parsed.Groups {
		for _, r := range g.Rules {
			if r.Alert == name {
				return alertRule{name: r.Alert, expr: r.Expr, hold: time.Duration(r.For)}
			}
		}
	}
	t.Fatalf("%s has no alert %s", rulesFile, name)
	return alertRule{}
}

// firingAfter evaluates rule's expression with Prometheus' engine every 30 s over st from
// start to minutes later, as a rule group with a 30 s interval does, and returns the
// namespace label of each alert firing at the end. It keeps the rule manager's states (its
// package rules: AlertingRule.Eval): a series the expression returns is pending from the
// first evaluation that returns it, firing once it has been returned at every evaluation for
// the rule's for, and forgotten at the first evaluation that does not return it.
func firingAfter(t *testing.T, rule alertRule, st *promStore, start time.Time, minutes int) []string {
	t.Helper()
	since := map[string]time.Time{} // series -> the evaluation that first returned it
	firing := map[string]string{}   // series -> its namespace, for those firing
	for ts := start; !ts.After(start.Add(time.Duration(minutes) * time.Minute)); ts = ts.Add(30 * time.Second) {
		returned := map[string]bool{}
		for _, s := range evaluate(t.Context(), t, st, rule.expr, ts) {
			k := s.Metric.String()
			returned[k] = true
			if _, ok := since[k]; !ok {
				since[k] = ts
			}
			if ts.Sub(since[k]) >= rule.hold {
				firing[k] = s.Metric.Get("namespace")
			}
		}
		for k := range since {
			if !returned[k] {
				delete(since, k)
				delete(firing, k)
			}
		}
	}
	out := slices.Sorted(maps.Values(firing))
	return out
}

// GDRDispatchAbsent and GDRGatewayAbsent, evaluated as Prometheus' rule manager evaluates the
// shipped rule file, over 15 minutes of KEDA's operator's series and the targets' up: each
// fires for its install's namespace when KEDA's ScaledObject of its component sees work (a
// scaler active) and no Pod of the component is up for the alert's for, however KEDA's
// operator is scraped; and never while the install idles at zero replicas (no work, no
// target: the design's zero-when-idle), while the component is up, while work waited for
// less than for, or while the ScaledObject is paused.
func TestAbsentAlerts(t *testing.T) {
	const ns, minutes = "gdr", 15
	for _, alert := range []struct{ name, component string }{{"GDRDispatchAbsent", "dispatch"}, {"GDRGatewayAbsent", "gateway"}} {
		so := alert.component // the ScaledObjects are named as their Deployments
		for _, tc := range []struct {
			name string
			at   func(minute int) []timedSample
			want []string
		}{
			{"work waits, no Pod (KEDA's ServiceMonitor)", func(int) []timedSample {
				return []timedSample{scalerActive(ns, so, 0, false, false), scalerActive(ns, so, 1, false, true)}
			}, []string{ns}},
			{"work waits, no Pod (honor_labels)", func(int) []timedSample {
				return []timedSample{scalerActive(ns, so, 0, true, true)}
			}, []string{ns}},
			{"work waits, its Pod down", func(int) []timedSample {
				return []timedSample{scalerActive(ns, so, 0, false, true), targetUp(ns, alert.component, 0)}
			}, []string{ns}},
			{"work waits, only another install's Pod up", func(int) []timedSample {
				return []timedSample{scalerActive(ns, so, 0, false, true), targetUp("other", alert.component, 1)}
			}, []string{ns}},
			{"idle at zero", func(int) []timedSample {
				return []timedSample{scalerActive(ns, so, 0, false, false), scalerActive(ns, so, 1, false, false)}
			}, nil},
			{"KEDA starts it", func(m int) []timedSample {
				s := []timedSample{scalerActive(ns, so, 0, false, true)}
				if m >= 1 {
					s = append(s, targetUp(ns, alert.component, 1))
				}
				return s
			}, nil},
			{"work waited under for", func(m int) []timedSample {
				return []timedSample{scalerActive(ns, so, 0, false, m >= minutes-3)}
			}, nil},
			{"up, then scaled to zero after the work", func(m int) []timedSample {
				if m < 5 {
					return []timedSample{scalerActive(ns, so, 0, false, true), targetUp(ns, alert.component, 1)}
				}
				return []timedSample{scalerActive(ns, so, 0, false, false)}
			}, nil},
			{"the other component's Pod up", func(int) []timedSample {
				other := map[string]string{"dispatch": "gateway", "gateway": "dispatch"}[alert.component]
				return []timedSample{scalerActive(ns, so, 0, false, true), targetUp(ns, other, 1)}
			}, []string{ns}},
			{"paused in KEDA, its last state active", func(int) []timedSample {
				return []timedSample{scalerActive(ns, so, 0, false, true),
					kedaSeries("keda_scaled_object_paused", map[string]string{"namespace": ns, "scaledObject": so}, false, 1)}
			}, nil},
		} {
			t.Run(alert.name+"/"+tc.name, func(t *testing.T) {
				start := time.Now().Truncate(time.Minute).Add(-time.Hour)
				st := storeTimeline(t, start, minutes, tc.at)
				if got := firingAfter(t, shippedAlert(t, alert.name), st, start, minutes); !slices.Equal(got, tc.want) {
					t.Errorf("%s firing for %q after %d minutes, want %q", alert.name, got, minutes, tc.want)
				}
			})
		}
	}
}

// pushedGroup is what Prometheus stores from a scrape of the Pushgateway (honor_labels, as the
// Pushgateway's chart's ServiceMonitor scrapes it) for one handle Job's push at pushedAt: the
// group's push_time_seconds and its gdr_assignments_total, labelled with the group's job and
// instance (the Pod). The Pushgateway serves a group's last push until it is deleted, so the
// series stay, their values never moving.
func pushedGroup(pod string, pushedAt time.Time, counts map[string]float64) []timedSample {
	group := map[string]string{"job": "gdr-handle", "instance": pod, "namespace": "monitoring", "pod": "pushgateway-0", "service": "pushgateway"}
	out := []timedSample{{labels: maps.Clone(group), value: float64(pushedAt.Unix())}}
	out[0].labels[labels.MetricName] = "push_time_seconds"
	for outcome, v := range counts {
		l := maps.Clone(group)
		l[labels.MetricName], l["backend"], l["outcome"] = "gdr_assignments_total", "pod", outcome
		out = append(out, timedSample{l, v})
	}
	return out
}

// GDRAssignmentsPoison fires for a poison or rejected assignment counted in the last 10
// minutes, whether handle's http mode counted it (a scraped counter that grew) or a job-mode
// run pushed it as it ended (a Pushgateway group pushed in the last 10 minutes: the group's
// counter never grows, it appears); a group pushed longer ago, or one with no poison, fires
// nothing.
func TestAssignmentsPoisonAlert(t *testing.T) {
	const minutes = 20
	for _, tc := range []struct {
		name string
		at   func(start time.Time) func(minute int) []timedSample
		want bool
	}{
		{"a job pushed a poison just now", func(start time.Time) func(int) []timedSample {
			return func(m int) []timedSample {
				s := pushedGroup("handle-pod-a", start, map[string]float64{"accepted": 3})
				if m >= minutes-2 {
					s = append(s, pushedGroup("handle-pod-b", start.Add((minutes-2)*time.Minute), map[string]float64{"poison": 1})...)
				}
				return s
			}
		}, true},
		{"a job pushed a poison 15 minutes ago", func(start time.Time) func(int) []timedSample {
			return func(m int) []timedSample {
				if m < 5 {
					return nil
				}
				return pushedGroup("handle-pod-b", start.Add(5*time.Minute), map[string]float64{"poison": 1, "accepted": 1})
			}
		}, false},
		{"jobs pushed nothing wrong", func(start time.Time) func(int) []timedSample {
			return func(m int) []timedSample {
				return pushedGroup("handle-pod-"+strconv.Itoa(m), start.Add(time.Duration(m)*time.Minute), map[string]float64{"accepted": 1})
			}
		}, false},
		{"http mode counted a poison", func(time.Time) func(int) []timedSample {
			return func(m int) []timedSample {
				v := 0.0
				if m >= minutes-1 {
					v = 1
				}
				return []timedSample{{map[string]string{labels.MetricName: "gdr_assignments_total", "job": "gitea-dynamic-runner", "instance": "10.0.1.9:8080",
					"backend": "pod", "outcome": "poison"}, v}}
			}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now().Truncate(time.Minute).Add(-time.Hour)
			st := storeTimeline(t, start, minutes, tc.at(start))
			rule := shippedAlert(t, "GDRAssignmentsPoison")
			v := evaluate(t.Context(), t, st, rule.expr, start.Add(minutes*time.Minute))
			fired := len(v) == 1 && v[0].Metric.Get("backend") == "pod" && v[0].Metric.Get("outcome") == "poison"
			if fired != tc.want || (!tc.want && len(v) != 0) {
				t.Errorf("%s: %v; want backend pod, outcome poison: %v", rule.expr, v, tc.want)
			}
		})
	}
}
