package deploy

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/internal/testenv/metricsenv"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/dispatcher"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics/dispatchmetrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/metrics/recovermetrics"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/recoverer"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/webhook"
)

// dashboardFile is the Grafana dashboard shipped in deploy/.
const dashboardFile = "grafana/gitea-dynamic-runner.json"

// The dashboard parses, every panel queries the Prometheus datasource
// variable, and every metric it queries is one the components export
// (each collector driven once, so that every series exists).
func TestDashboardQueriesExistingMetrics(t *testing.T) {
	dash := loadDashboard(t)
	if dash.UID == "" || len(dash.Panels) == 0 {
		t.Fatalf("%s: no uid or no panels", dashboardFile)
	}
	exported := exportedMetrics(t)
	name := regexp.MustCompile(`\bgdr_[a-z0-9_]+`)
	queried := 0
	for _, p := range dash.Panels {
		if p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %q, want ${datasource}", p.Title, p.Datasource.UID)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, target := range p.Targets {
			names := name.FindAllString(target.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q: %q queries no gdr_ metric", p.Title, target.Expr)
			}
			for _, n := range names {
				queried++
				if !exported[n] {
					t.Errorf("panel %q queries %s, which no component exports", p.Title, n)
				}
			}
		}
	}
	t.Logf("%d panels, %d metric references, all exported", len(dash.Panels), queried)
}

// dashboard is what the tests read of the shipped dashboard.
type dashboard struct {
	UID    string `json:"uid"`
	Panels []struct {
		Title      string `json:"title"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// loadDashboard reads and decodes the shipped dashboard.
func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash dashboard
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return dash
}

// exportedMetrics are the sample names the components export: each
// family's name, and a histogram's _bucket, _sum and _count.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	reg, drive := components()
	drive()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, f := range fams {
		out[f.GetName()] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				out[f.GetName()+s] = true
			}
		}
	}
	return out
}

// components registers every component's collectors with one registry;
// each call of drive moves each of them once (a round, a claim, a request, a
// job started and finished, a pass), so that every series exists and every
// counter grows between two scrapes.
func components() (*prometheus.Registry, func()) {
	reg := metrics.NewRegistry()
	d := dispatchmetrics.NewDispatch(reg)
	a := metrics.NewOutcomes(reg)
	requests := metrics.NewRequests(reg, "gateway", "UpdateTask").Wrap(http.NotFoundHandler())
	started := metrics.NewStarted(reg)
	r := recovermetrics.NewRecover(reg)
	jobs := dispatchmetrics.NewJobs(reg, []runnerpool.Pool{{Name: "linux", Labels: []string{"linux"}}})
	reg.MustRegister(metrics.NewConsumers(func(context.Context, string, string) (*jetstream.ConsumerInfo, error) {
		return &jetstream.ConsumerInfo{}, nil
	}, "CI_RUNNER", []string{"pod"}, nil))
	reg.MustRegister(metrics.NewExecutors(map[taskassignment.BackendKind]metrics.ExecutorLister{"pod": noExecutors{}}, nil))
	return reg, func() {
		d.Round(dispatcher.Result{Pool: "linux"}, nil)
		d.Round(dispatcher.Result{Pool: "linux"}, context.DeadlineExceeded)
		d.Queued("linux", time.Second)
		a.Handled("pod", handler.Accepted)
		requests.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/runner.v1.RunnerService/UpdateTask", nil))
		started.Started("linux", time.Second)
		started.Finished("linux", runnerv1.Result_RESULT_SUCCESS, time.Minute)
		r.Pass(recoverer.Summary{}, nil)
		created := time.Now().Add(-time.Minute)
		jobs.Delivered(webhook.Job{Action: webhook.ActionInProgress, Labels: []string{"linux"}, CreatedAt: created, StartedAt: created.Add(time.Second)})
		jobs.Delivered(webhook.Job{Action: webhook.ActionCompleted, Labels: []string{"linux"}, Conclusion: "success",
			CreatedAt: created, FirstStepAt: created.Add(5 * time.Second)})
		jobs.Delivered(webhook.Job{Action: webhook.ActionCompleted, Labels: []string{"linux"}, Conclusion: "cancelled", CreatedAt: created})
	}
}

// Every query of the dashboard, evaluated by Prometheus' engine over two
// scrapes of the components 30 s apart, returns a series: no panel is
// empty for want of a series or over a query Prometheus refuses. The
// cluster test does the same over the metrics it scrapes from the install
// (TestE2EClusterInstall/Metrics).
func TestDashboardQueriesEvaluate(t *testing.T) {
	reg, drive := components()
	at := time.Now()
	var scrapes []scraped
	for i := range 2 {
		drive()
		scrapes = append(scrapes, scraped{at: at.Add(time.Duration(i) * 30 * time.Second), fams: metricsenv.Gather(t, reg)})
	}
	assertDashboardFed(t.Context(), t, scrapes)
}

// noExecutors is a backend that holds none.
type noExecutors struct{}

func (noExecutors) RecoverAssignments(context.Context) ([]taskassignment.Assignment, error) {
	return nil, nil
}

func (noExecutors) Find(context.Context, string) (*executor.Executor, error) { return nil, nil }
