package kubeenv

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Requests are the API server's request counts (apiserver_request_total,
// every response code) by "VERB resource" or "VERB resource/subresource",
// e.g. "POST pods", "LIST pods", "GET secrets". Requests for no resource
// (discovery, /metrics, /healthz) are left out; the API server's own (an
// admission plugin's LIST limitranges when a Pod is created in a namespace
// it has not cached) are in.
type Requests map[string]float64

// Requests reads the counts from the API server's /metrics. They count what
// every client asked since the plane started: take them before and after,
// and subtract (Minus).
func (p *Plane) Requests(ctx context.Context) (Requests, error) {
	c, err := kubernetes.NewForConfig(p.RESTConfig())
	if err != nil {
		return nil, fmt.Errorf("kubeenv: clientset: %w", err)
	}
	raw, err := c.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("kubeenv: read the API server's metrics: %w", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("kubeenv: parse the API server's metrics: %w", err)
	}
	f, ok := families["apiserver_request_total"]
	if !ok {
		return nil, fmt.Errorf("kubeenv: the API server's metrics have no apiserver_request_total")
	}
	out := Requests{}
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		resource := labels["resource"]
		if resource == "" {
			continue
		}
		if sub := labels["subresource"]; sub != "" {
			resource += "/" + sub
		}
		out[labels["verb"]+" "+resource] += m.GetCounter().GetValue()
	}
	return out, nil
}

// Minus returns r - before, keeping only what grew.
func (r Requests) Minus(before Requests) Requests {
	out := Requests{}
	for k, v := range r {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// Without returns r without the requests for resources (all verbs).
func (r Requests) Without(resources ...string) Requests {
	out := Requests{}
	for k, v := range r {
		if _, res, _ := strings.Cut(k, " "); !slices.Contains(resources, res) {
			out[k] = v
		}
	}
	return out
}

// Only returns the requests of r for resources (all verbs).
func (r Requests) Only(resources ...string) Requests {
	out := Requests{}
	for k, v := range r {
		if _, res, _ := strings.Cut(k, " "); slices.Contains(resources, res) {
			out[k] = v
		}
	}
	return out
}

// Total is the number of requests in r.
func (r Requests) Total() float64 {
	var n float64
	for _, v := range r {
		n += v
	}
	return n
}

// Per renders r divided by n, sorted: "GET pods 1.00, LIST pods 1.00".
func (r Requests) Per(n int) string {
	parts := []string{}
	for _, k := range slices.Sorted(maps.Keys(r)) {
		parts = append(parts, fmt.Sprintf("%s %.2f", k, r[k]/float64(n)))
	}
	return strings.Join(parts, ", ")
}

// WriteKubeconfig writes a kubeconfig of the plane's admin to path: what a
// function given KUBECONFIG reads.
func (p *Plane) WriteKubeconfig(path string) error {
	rc := p.RESTConfig()
	err := clientcmd.WriteToFile(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"test": {Server: rc.Host, CertificateAuthorityData: rc.CAData, InsecureSkipTLSVerify: rc.Insecure}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"test": {Token: rc.BearerToken, ClientCertificateData: rc.CertData, ClientKeyData: rc.KeyData}},
		Contexts:       map[string]*clientcmdapi.Context{"test": {Cluster: "test", AuthInfo: "test"}},
		CurrentContext: "test",
	}, path)
	if err != nil {
		return fmt.Errorf("kubeenv: write kubeconfig %s: %w", path, err)
	}
	return nil
}
