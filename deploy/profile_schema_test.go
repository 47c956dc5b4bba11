package deploy

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
)

var updateSchema = flag.Bool("update-schema", false, "rewrite the pools' profile rules of the chart's values.schema.json from the backends' Profile types (make docs)")

// typeSchema is the JSON schema of a profile type, as the backend reads it (encoding/json with
// unknown fields refused): an object has exactly its json fields. A Pod template is the pod
// backend's and Kubernetes' to check (ParseProfile, the API server), a duration a string
// (metav1.Duration), a raw value anything.
func typeSchema(t reflect.Type) map[string]any {
	switch t {
	case reflect.TypeOf(corev1.PodTemplateSpec{}):
		return map[string]any{"type": "object"}
	case reflect.TypeOf(metav1.Duration{}):
		return map[string]any{"type": "string"}
	case reflect.TypeOf(json.RawMessage{}):
		return map[string]any{}
	}
	switch t.Kind() {
	case reflect.Pointer:
		return typeSchema(t.Elem())
	case reflect.Struct:
		props := map[string]any{}
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !f.IsExported() || name == "-" || name == "" {
				continue
			}
			props[name] = typeSchema(f.Type)
		}
		return map[string]any{"type": "object", "additionalProperties": false, "properties": props}
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int32, reflect.Int64:
		return map[string]any{"type": "integer"}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": typeSchema(t.Elem())}
	case reflect.Slice:
		return map[string]any{"type": "array", "items": typeSchema(t.Elem())}
	}
	panic("typeSchema: no schema for " + t.String())
}

// profileRules are the pools' items' rules: a pool's profile is its backend's Profile.
func profileRules() []any {
	rule := func(backend string, profile any) any {
		return map[string]any{
			"if":   map[string]any{"properties": map[string]any{"backend": map[string]any{"const": backend}}, "required": []any{"backend"}},
			"then": map[string]any{"properties": map[string]any{"profile": typeSchema(reflect.TypeOf(profile))}},
		}
	}
	return []any{rule("pod", pod.Profile{}), rule("opensandbox", opensandbox.Profile{})}
}

// TestHelmSchemaChecksProfiles: values.schema.json's pools carry each backend's profile rules,
// generated from the Profile types (so a field added there is a field the schema knows: make
// docs rewrites them); Helm then refuses a misspelt profile key and another backend's key
// before anything reaches the cluster, and renders the shipped values.
func TestHelmSchemaChecksProfiles(t *testing.T) {
	file := filepath.Join(chartDir, "values.schema.json")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(data, &schema); err != nil {
		t.Fatal(err)
	}
	items := path(schema, "properties", "pools", "items").(map[string]any)
	want, err := json.Marshal(profileRules())
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(items["allOf"])
	if string(got) != string(want) {
		if !*updateSchema {
			t.Fatalf("%s: the pools' profile rules are not the backends' Profile types (regenerate: make docs)", file)
		}
		var rules []any
		_ = json.Unmarshal(want, &rules)
		items["allOf"] = rules
		out, err := json.MarshalIndent(schema, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, append(out, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pool := func(backend string, profile map[string]any) map[string]any {
		return map[string]any{"pools": []any{map[string]any{"name": "p", "labels": []any{"x"}, "backend": backend, "capacity": 1, "profile": profile}}}
	}
	for _, tc := range []struct {
		name string
		vals map[string]any
		want string // "": renders
	}{
		{"shipped", nil, ""},
		{"pod, misspelt", pool("pod", map[string]any{"runnerImag": "x"}), "runnerImag"},
		{"pod, docker misspelt", pool("pod", map[string]any{"docker": map[string]any{"image": "d", "userNamespaces": true}}), "userNamespaces"},
		{"pod, docker", pool("pod", map[string]any{"docker": map[string]any{"image": "d", "userNamespace": true}, "podTemplate": map[string]any{}}), ""},
		{"opensandbox, a pod key", pool("opensandbox", map[string]any{"podTemplate": map[string]any{}}), "podTemplate"},
		{"opensandbox", pool("opensandbox", map[string]any{"poolRef": "ci"}), ""},
	} {
		_, err := renderChart(t, installNamespace, tc.vals)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want the schema to refuse %q", tc.name, err, tc.want)
		}
	}
}
