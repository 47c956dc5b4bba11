package metrics

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/handler"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// serve serves h and returns its URL.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func scrape(t *testing.T, url string) Families {
	t.Helper()
	fams, err := Scrape(t.Context(), http.DefaultClient, url+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// Requests counts by RPC name and code, and a path a client makes up
// counts as "other", never as a label value of its own.
func TestRequests(t *testing.T) {
	reg := NewRegistry()
	m := NewRequests(reg, "gateway", "UpdateTask", "FetchTask")
	mux := http.NewServeMux()
	Register(mux, reg)
	mux.Handle("/", m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "FetchTask") {
			http.Error(w, "no", http.StatusForbidden)
			return
		}
		_, _ = w.Write([]byte("ok")) // an implicit 200
	})))
	url := serve(t, mux)
	for _, p := range []string{"/runner.v1.RunnerService/UpdateTask", "/runner.v1.RunnerService/UpdateTask", "/runner.v1.RunnerService/FetchTask", "/made-up-secret-path"} {
		resp, err := http.Post(url+p, "application/proto", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	fams := scrape(t, url)
	for _, want := range []struct {
		method, code string
		n            float64
	}{{"UpdateTask", "200", 2}, {"FetchTask", "403", 1}, {"other", "200", 1}} {
		if v, _ := fams.Value("gdr_gateway_requests_total", "method", want.method, "code", want.code); v != want.n {
			t.Errorf("requests{method=%s,code=%s} = %v, want %v", want.method, want.code, v, want.n)
		}
	}
	if n := testutil.CollectAndCount(m.total); n != 3 {
		t.Errorf("%d request series, want 3 (the made-up path is \"other\")", n)
	}
}

func TestOutcomes(t *testing.T) {
	reg := NewRegistry()
	a := NewOutcomes(reg)
	var obs handler.Observer = a
	obs.Handled("pod", handler.Accepted)
	obs.Handled("pod", handler.NotYet)
	obs.Handled("not-a-backend", handler.Poison)
	fams := gather(t, reg)
	for _, want := range []struct {
		name   string
		labels []string
		v      float64
	}{
		{"gdr_assignments_total", []string{"backend", "pod", "outcome", "accepted"}, 1},
		{"gdr_assignments_total", []string{"backend", "pod", "outcome", "not_yet"}, 1},
		{"gdr_assignments_total", []string{"backend", "unknown", "outcome", "poison"}, 1},
	} {
		if v, ok := fams.Value(want.name, want.labels...); !ok || v != want.v {
			t.Errorf("%s%v = %v (%v), want %v", want.name, want.labels, v, ok, want.v)
		}
	}
}

// Consumers reads each consumer on scrape; one it cannot read shows as
// info_up 0, the others still report.
func TestConsumers(t *testing.T) {
	reg := NewRegistry()
	reg.MustRegister(NewConsumers(func(_ context.Context, stream, consumer string) (*jetstream.ConsumerInfo, error) {
		if consumer == "opensandbox" {
			return nil, errors.New("consumer not found")
		}
		return &jetstream.ConsumerInfo{Stream: stream, Name: consumer, NumPending: 3, NumAckPending: 2, NumRedelivered: 1}, nil
	}, "CI_RUNNER", []string{"pod", "opensandbox"}, nil))
	fams := gather(t, reg)
	for _, want := range []struct {
		name     string
		consumer string
		v        float64
	}{
		{"gdr_consumer_pending_messages", "pod", 3},
		{"gdr_consumer_ack_pending_messages", "pod", 2},
		{"gdr_consumer_redelivered_messages", "pod", 1},
		{"gdr_consumer_info_up", "pod", 1},
		{"gdr_consumer_info_up", "opensandbox", 0},
	} {
		if v, ok := fams.Value(want.name, "stream", "CI_RUNNER", "consumer", want.consumer); !ok || v != want.v {
			t.Errorf("%s{consumer=%s} = %v (%v), want %v", want.name, want.consumer, v, ok, want.v)
		}
	}
	if _, ok := fams.Value("gdr_consumer_pending_messages", "consumer", "opensandbox"); ok {
		t.Error("an unreadable consumer reports a pending count")
	}
}

// gather scrapes reg over HTTP, as Prometheus does.
func gather(t *testing.T, reg prometheus.Gatherer) Families {
	t.Helper()
	mux := http.NewServeMux()
	Register(mux, reg)
	return scrape(t, serve(t, mux))
}

// lister is a backend of fixed executors.
type lister map[string]executor.Phase

func (l lister) RecoverAssignments(context.Context) ([]taskassignment.Assignment, error) {
	var as []taskassignment.Assignment
	for id := range l {
		as = append(as, taskassignment.Assignment{ID: id})
	}
	return as, nil
}

func (l lister) Find(_ context.Context, id string) (*executor.Executor, error) {
	return &executor.Executor{Name: id, Phase: l[id]}, nil
}

func TestExecutors(t *testing.T) {
	reg := NewRegistry()
	reg.MustRegister(NewExecutors(map[taskassignment.BackendKind]ExecutorLister{
		"process": lister{"linux-1": executor.PhaseRunning, "linux-2": executor.PhaseRunning, "linux-3": executor.PhasePending, "linux-4": "odd"},
	}, nil))
	fams := gather(t, reg)
	for phase, want := range map[string]float64{"running": 2, "pending": 1, "succeeded": 0, "unknown": 1} {
		if v, ok := fams.Value("gdr_executors", "backend", "process", "phase", phase); !ok || v != want {
			t.Errorf("gdr_executors{phase=%s} = %v (%v), want %v", phase, v, ok, want)
		}
	}
}

// The gateway's job metrics: by pool and result, an unknown result value
// counts as "unknown", and the duration histogram holds the run.
func TestStartedJobs(t *testing.T) {
	reg := NewRegistry()
	m := NewStarted(reg)
	m.Finished("linux", runnerv1.Result_RESULT_SUCCESS, 90*time.Second)
	m.Finished("linux", runnerv1.Result_RESULT_SUCCESS, 30*time.Second)
	m.Finished("linux", runnerv1.Result(42), 0)
	fams := gather(t, reg)
	for _, want := range []struct {
		name, result string
		v            float64
	}{
		{"gdr_jobs_total", "success", 2},
		{"gdr_jobs_total", "unknown", 1},
		{"gdr_job_duration_seconds", "success", 2},
	} {
		if v, ok := fams.Value(want.name, "pool", "linux", "result", want.result); !ok || v != want.v {
			t.Errorf("%s{result=%s} = %v (%v), want %v", want.name, want.result, v, ok, want.v)
		}
	}
	if sum := fams["gdr_job_duration_seconds"].GetMetric()[0].GetHistogram().GetSampleSum(); sum != 120 {
		t.Errorf("job duration sum %v, want 120", sum)
	}
}
