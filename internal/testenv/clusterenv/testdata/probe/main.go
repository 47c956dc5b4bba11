// Command probe prints what a Pod sees of the cluster, one check per
// argument (none: "sa"), one line each, and exits 1 if a check could not
// run:
//   - sa: the size of the projected ServiceAccount token and CA bundle, the
//     namespace file, and the API server's address from the environment;
//   - api: the HTTP status of listing the Pod's namespace's pods and secrets
//     through the "kubernetes" Service (KUBERNETES_SERVICE_HOST/PORT, the
//     token, the CA bundle: what client-go's in-cluster configuration does);
//   - dial=<host:port>: a line sent over TCP and the line that comes back;
//   - connect=<label>@<host:port>: one TCP connection attempt (3 s at most),
//     printed as <label>=ok or <label>=fail:<reason>; a refused or timed-out
//     connection is a result, not a failure of the check;
//   - read=<path>: the file's first line, printed as "read <path>: <line>";
//   - output=<name>:<variable>: "<name>=<the variable's value>" appended to
//     the file GITHUB_OUTPUT names (a step's output, as a container action
//     sets one), and printed as "output <name>=<value>".
//
// With every=<duration> first, it runs the connect checks that follow for
// ever, one round every <duration>, each printed on one line
// "round <start, Unix nanoseconds> <label>=<result> ...": a caller reading
// the log takes the first round that started after a moment of its own
// (the clocks are the machine's).
//
// Only the standard library: the image stays small and builds fast.
package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"
)

const saDir = "/var/run/secrets/kubernetes.io/serviceaccount"

func main() {
	checks := os.Args[1:]
	if len(checks) == 0 {
		checks = []string{"sa"}
	}
	if every, ok := strings.CutPrefix(checks[0], "every="); ok {
		if err := rounds(every, checks[1:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	failed := false
	for _, c := range checks {
		if err := run(c); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", c, err)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}

func run(check string) error {
	switch {
	case check == "sa":
		tok, err := os.ReadFile(saDir + "/token")
		ns, _ := os.ReadFile(saDir + "/namespace")
		ca, _ := os.ReadFile(saDir + "/ca.crt")
		fmt.Printf("token=%d namespace=%s ca=%d host=%s\n", len(tok), ns, len(ca), os.Getenv("KUBERNETES_SERVICE_HOST"))
		return err
	case check == "api":
		return api()
	case strings.HasPrefix(check, "dial="):
		return dial(strings.TrimPrefix(check, "dial="))
	case strings.HasPrefix(check, "read="):
		path := strings.TrimPrefix(check, "read=")
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		line, _, _ := strings.Cut(string(b), "\n")
		fmt.Printf("read %s: %s\n", path, line)
		return nil
	case strings.HasPrefix(check, "output="):
		name, variable, ok := strings.Cut(strings.TrimPrefix(check, "output="), ":")
		if !ok {
			return fmt.Errorf("want output=<name>:<variable>")
		}
		f, err := os.OpenFile(os.Getenv("GITHUB_OUTPUT"), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := fmt.Fprintf(f, "%s=%s\n", name, os.Getenv(variable)); err != nil {
			return err
		}
		fmt.Printf("output %s=%s\n", name, os.Getenv(variable))
		return f.Close()
	case strings.HasPrefix(check, "connect="):
		label, addr, ok := strings.Cut(strings.TrimPrefix(check, "connect="), "@")
		if !ok {
			return fmt.Errorf("want connect=<label>@<host:port>")
		}
		fmt.Println(connect(label, addr))
		return nil
	}
	return fmt.Errorf("unknown check")
}

func api() error {
	tok, err := os.ReadFile(saDir + "/token")
	if err != nil {
		return err
	}
	ns, err := os.ReadFile(saDir + "/namespace")
	if err != nil {
		return err
	}
	caPEM, err := os.ReadFile(saDir + "/ca.crt")
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("no certificate in ca.crt")
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	host := net.JoinHostPort(os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT"))
	var out []string
	for _, resource := range []string{"pods", "secrets"} {
		req, err := http.NewRequest(http.MethodGet, "https://"+host+"/api/v1/namespaces/"+string(ns)+"/"+resource, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		out = append(out, fmt.Sprintf("%s=%d", resource, resp.StatusCode))
	}
	fmt.Println(strings.Join(out, " "))
	return nil
}

// dial retries for 20 s: kube-proxy programs a new Service's rules within
// a second or so of its EndpointSlice.
func dial(addr string) error {
	var conn net.Conn
	var err error
	for deadline := time.Now().Add(20 * time.Second); ; {
		if conn, err = net.DialTimeout("tcp", addr, 5*time.Second); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintln(conn, "ping from probe"); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	fmt.Printf("dial %s: %s\n", addr, strings.TrimSpace(line))
	return nil
}

// connect makes one TCP connection attempt to addr and returns
// "<label>=ok" or "<label>=fail:<reason>" (no spaces).
func connect(label, addr string) string {
	conn, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err == nil {
		conn.Close()
		return label + "=ok"
	}
	reason := err.Error()
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		reason = "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		reason = "refused"
	case errors.Is(err, syscall.EHOSTUNREACH):
		reason = "unreachable"
	}
	return label + "=fail:" + strings.ReplaceAll(reason, " ", "_")
}

// rounds runs the connect checks every interval until killed.
func rounds(interval string, checks []string) error {
	d, err := time.ParseDuration(interval)
	if err != nil {
		return fmt.Errorf("every=%s: %w", interval, err)
	}
	type target struct{ label, addr string }
	var targets []target
	for _, c := range checks {
		label, addr, ok := strings.Cut(strings.TrimPrefix(c, "connect="), "@")
		if !strings.HasPrefix(c, "connect=") || !ok {
			return fmt.Errorf("every=: only connect=<label>@<host:port> checks, not %q", c)
		}
		targets = append(targets, target{label, addr})
	}
	for {
		start := time.Now()
		line := []string{"round", fmt.Sprint(start.UnixNano())}
		for _, tg := range targets {
			line = append(line, connect(tg.label, tg.addr))
		}
		fmt.Println(strings.Join(line, " "))
		time.Sleep(d)
	}
}
