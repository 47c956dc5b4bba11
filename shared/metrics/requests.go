package metrics

import (
	"net/http"
	"path"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Requests counts a listener's requests by method and status code.
type Requests struct {
	total   *prometheus.CounterVec
	methods map[string]bool
}

// NewRequests registers the request counter of subsystem ("gateway") with
// reg. methods are the method label values it may take: the last segment of
// a request's path when it is one of them (an RPC name, "UpdateTask"), any
// other request counts as "other", so that no path a client makes up
// becomes a label value.
func NewRequests(reg prometheus.Registerer, subsystem string, methods ...string) *Requests {
	m := &Requests{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: subsystem, Name: "requests_total",
			Help: "Requests answered, by method (RPC name, or other) and HTTP status code."}, []string{"method", "code"}),
		methods: map[string]bool{},
	}
	for _, s := range methods {
		m.methods[s] = true
	}
	reg.MustRegister(m.total)
	return m
}

// Wrap counts every request next answers.
func (m *Requests) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &recorder{ResponseWriter: w, code: http.StatusOK}
		next.ServeHTTP(rec, r)
		method := path.Base(r.URL.Path)
		if !m.methods[method] {
			method = "other"
		}
		m.total.WithLabelValues(method, strconv.Itoa(rec.code)).Inc()
	})
}

// recorder remembers the status code written.
type recorder struct {
	http.ResponseWriter
	code  int
	wrote bool
}

func (r *recorder) WriteHeader(code int) {
	if !r.wrote {
		r.code, r.wrote = code, true
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	r.wrote = true
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer
// (flushes, deadlines).
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
