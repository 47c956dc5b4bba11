// Package jobservices describes a workflow job's `services:` containers as
// the workflow declares them, and the readiness the runner waits for.
//
// dispatch and recover read the services from the task's workflow payload
// (taskworkflow.FromWorkflow, with act's workflow model) into the signed
// assignment; a backend that runs them (the
// Pod backend, as sidecars sharing the executor's network namespace) maps
// them onto its executor, and the runner, which reads the same payload from
// the gateway, waits until their ports accept connections (WaitReady).
// Nothing here evaluates an expression: a value holding `${{` is carried as
// written, and a backend that cannot evaluate it refuses it.
package jobservices

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Service is one entry of a job's `services:`, as written in the workflow.
// Credentials are never copied: Credentials only says the entry has some.
type Service struct {
	// ID is the entry's key: the service's hostname for the job.
	ID      string
	Image   string
	Env     map[string]string
	Ports   []string
	Volumes []string
	// Cmd is Gitea's `cmd:` (the container's arguments).
	Cmd []string
	// Options is the `options:` string of `docker create` flags.
	Options string
	// Credentials says the entry sets `credentials:`.
	Credentials bool
}

// IDs returns the services' IDs, in order.
func IDs(services []Service) []string {
	ids := make([]string, len(services))
	for i, s := range services {
		ids[i] = s.ID
	}
	return ids
}

// Port is a TCP port a service listens on.
type Port int32

// ParsePorts reads a service's `ports:` for an executor where the service
// shares the job's network namespace: each entry is a container port
// (`5432`, `5432/tcp`), or a mapping onto the same port (`5432:5432`), since
// nothing can publish a port under another number there. Ranges, another
// host port, a host IP and UDP are refused, naming the entry.
func ParsePorts(ports []string) ([]Port, error) {
	var out []Port
	for _, p := range ports {
		spec, proto, _ := strings.Cut(strings.TrimSpace(p), "/")
		if proto != "" && proto != "tcp" {
			return nil, fmt.Errorf("port %q: only TCP ports are supported", p)
		}
		parts := strings.Split(spec, ":")
		if len(parts) > 2 {
			return nil, fmt.Errorf("port %q: a host IP cannot be chosen: the service listens in the executor's own network namespace", p)
		}
		var nums []Port
		for _, s := range parts {
			n, err := strconv.ParseUint(s, 10, 16)
			if err != nil || n == 0 {
				return nil, fmt.Errorf("port %q: want a port number, or <port>:<the same port> (no ranges)", p)
			}
			nums = append(nums, Port(n))
		}
		if len(nums) == 2 && nums[0] != nums[1] {
			return nil, fmt.Errorf("port %q: the service's port cannot be published under another number: it shares the executor's network namespace (use %d:%d, or %d)", p, nums[1], nums[1], nums[1])
		}
		if !slices.Contains(out, nums[len(nums)-1]) {
			out = append(out, nums[len(nums)-1])
		}
	}
	return out, nil
}

// HasExpression reports whether s holds a `${{ }}` expression.
func HasExpression(s string) bool { return strings.Contains(s, "${{") }

// DefaultReadyTimeout is how long WaitReady waits when given no timeout.
const DefaultReadyTimeout = 2 * time.Minute

// retryEvery is the pause between two connection attempts to one port.
const retryEvery = 200 * time.Millisecond

// NotReadyError says which service did not accept connections in time.
type NotReadyError struct {
	Service string
	Port    Port
	Timeout time.Duration
	// Last is the last connection error.
	Last error
}

func (e *NotReadyError) Error() string {
	return fmt.Sprintf("service %s: port %d on 127.0.0.1 accepted no connection within %s (last attempt: %v)", e.Service, e.Port, e.Timeout, e.Last)
}

func (e *NotReadyError) Unwrap() error { return e.Last }

// WaitReady waits until every TCP port of every service accepts a
// connection on 127.0.0.1, for at most timeout in all (DefaultReadyTimeout
// when zero or less). A port that does not, in time, is a *NotReadyError
// naming the service and the port; a cancelled ctx is ctx's error. onWait,
// if set, is called once per port before its first attempt.
func WaitReady(ctx context.Context, services []Service, timeout time.Duration, onWait func(service string, port Port)) error {
	if timeout <= 0 {
		timeout = DefaultReadyTimeout
	}
	deadline := time.Now().Add(timeout)
	var d net.Dialer
	for _, s := range services {
		ports, err := ParsePorts(s.Ports)
		if err != nil {
			return fmt.Errorf("service %s: %w", s.ID, err)
		}
		for _, p := range ports {
			if onWait != nil {
				onWait(s.ID, p)
			}
			addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(p)))
			for {
				attempt, cancel := context.WithDeadline(ctx, deadline)
				conn, err := d.DialContext(attempt, "tcp", addr)
				cancel()
				if err == nil {
					_ = conn.Close()
					break
				}
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if !time.Now().Before(deadline) {
					return &NotReadyError{Service: s.ID, Port: p, Timeout: timeout, Last: err}
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(min(retryEvery, time.Until(deadline))):
				}
			}
		}
	}
	return nil
}

// portExpression matches `job.services.<id>.ports[<port>]` inside an
// expression, the port quoted ('5432', or ”5432” within a YAML
// single-quoted scalar) or not.
var portExpression = regexp.MustCompile(`(?i)\bjob\.services\.([a-z0-9_-]+)\.ports\[\s*(?:''?)?([0-9]+)(?:''?)?\s*\]`)

// ExpandPortExpressions returns payload with every
// `job.services.<id>.ports['<port>']` of a port the service declares
// replaced by the port's number: the port the job reaches it on, since the
// service shares the executor's network namespace (what GitHub's
// job.services context gives, and act's does not). A number is a valid
// expression wherever the lookup was, and in a string it reads the same.
// Other lookups are left as written.
func ExpandPortExpressions(payload []byte, services []Service) []byte {
	declared := map[string][]Port{}
	for _, s := range services {
		ports, err := ParsePorts(s.Ports)
		if err == nil {
			declared[strings.ToLower(s.ID)] = ports
		}
	}
	return portExpression.ReplaceAllFunc(payload, func(m []byte) []byte {
		sub := portExpression.FindSubmatch(m)
		n, err := strconv.ParseUint(string(sub[2]), 10, 16)
		if err != nil || !slices.Contains(declared[strings.ToLower(string(sub[1]))], Port(n)) {
			return m
		}
		return []byte(strconv.FormatUint(n, 10))
	})
}
