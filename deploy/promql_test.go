package deploy

import (
	"context"
	"math"
	"strconv"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
)

// scraped is one scrape of one component: its families, taken at at.
type scraped struct {
	at   time.Time
	fams metrics.Families
}

// storeScrapes holds the samples of scrapes as Prometheus stores a
// scrape's text: a counter's or gauge's value under its name, a
// histogram's cumulative buckets (le), _sum and _count.
func storeScrapes(t *testing.T, scrapes []scraped) *promStore {
	t.Helper()
	st := newPromStore()
	add := func(name string, m *dto.Metric, at time.Time, v float64, extra ...string) {
		pairs := []string{labels.MetricName, name}
		for _, l := range m.GetLabel() {
			pairs = append(pairs, l.GetName(), l.GetValue())
		}
		if err := st.add(labels.FromStrings(append(pairs, extra...)...), at.UnixMilli(), v); err != nil {
			t.Fatalf("store %s: %v", name, err)
		}
	}
	for _, s := range scrapes {
		for name, f := range s.fams {
			for _, m := range f.GetMetric() {
				switch {
				case m.Counter != nil:
					add(name, m, s.at, m.GetCounter().GetValue())
				case m.Gauge != nil:
					add(name, m, s.at, m.GetGauge().GetValue())
				case m.Untyped != nil:
					add(name, m, s.at, m.GetUntyped().GetValue())
				case m.Histogram != nil:
					h := m.GetHistogram()
					for _, b := range h.GetBucket() {
						add(name+"_bucket", m, s.at, float64(b.GetCumulativeCount()), "le", strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64))
					}
					add(name+"_bucket", m, s.at, float64(h.GetSampleCount()), "le", "+Inf")
					add(name+"_sum", m, s.at, h.GetSampleSum())
					add(name+"_count", m, s.at, float64(h.GetSampleCount()))
				case m.Summary != nil:
					add(name+"_sum", m, s.at, m.GetSummary().GetSampleSum())
					add(name+"_count", m, s.at, float64(m.GetSummary().GetSampleCount()))
				}
			}
		}
	}
	return st
}

// evaluate runs the instant query expr with Prometheus' engine over st at
// at and returns its vector.
func evaluate(ctx context.Context, t *testing.T, st storage.Queryable, expr string, at time.Time) promql.Vector {
	t.Helper()
	eng := promql.NewEngine(promql.EngineOpts{MaxSamples: 1_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	q, err := eng.NewInstantQuery(ctx, st, nil, expr, at)
	if err != nil {
		t.Fatalf("%q: %v", expr, err)
	}
	defer q.Close()
	res := q.Exec(ctx)
	if res.Err != nil {
		t.Fatalf("%q: %v", expr, res.Err)
	}
	v, err := res.Vector()
	if err != nil {
		t.Fatalf("%q: %v", expr, err)
	}
	return v
}

// dashboardQuery is one query of one panel of the shipped dashboard.
type dashboardQuery struct{ panel, expr string }

// dashboardQueries are every query of the shipped dashboard.
func dashboardQueries(t *testing.T) []dashboardQuery {
	t.Helper()
	dash := loadDashboard(t)
	var out []dashboardQuery
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			out = append(out, dashboardQuery{p.Title, tg.Expr})
		}
	}
	return out
}

// assertDashboardFed evaluates every dashboard query over scrapes, at the
// last scrape, and fails for each that returns no series (an empty panel)
// or only NaN values where a number was due (a histogram whose buckets
// never moved counts: its quantile is NaN until a sample arrives, so those
// are reported apart, not failed).
func assertDashboardFed(ctx context.Context, t *testing.T, scrapes []scraped) {
	t.Helper()
	st := storeScrapes(t, scrapes)
	at := scrapes[len(scrapes)-1].at
	for _, q := range dashboardQueries(t) {
		v := evaluate(ctx, t, st, q.expr, at)
		if len(v) == 0 {
			t.Errorf("panel %q: %s is empty", q.panel, q.expr)
			continue
		}
		nan := 0
		for _, s := range v {
			if math.IsNaN(s.F) {
				nan++
			}
		}
		t.Logf("panel %q: %s: %d series (%d NaN), e.g. %s", q.panel, q.expr, len(v), nan, v[0])
	}
}

// metricNames are the metric names expr selects.
func metricNames(t *testing.T, expr string) []string {
	t.Helper()
	e, err := parser.ParseExpr(expr)
	if err != nil {
		t.Fatalf("%q: %v", expr, err)
	}
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			names = append(names, vs.Name)
		}
		return nil
	})
	return names
}
