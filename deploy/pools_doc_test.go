package deploy

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/opensandbox"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/backend/pod"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

const poolsDoc = "../docs/POOLS.md"

// yamlBlocks returns the ```yaml blocks of a Markdown text.
func yamlBlocks(text string) []string {
	return regexp.MustCompile("(?ms)^```yaml\n(.*?)^```").FindAllString(text, -1)
}

// TestPoolsDocExamples: every YAML block of docs/POOLS.md and README.md is a pools file the
// functions accept (runnerpool.Parse), and each pool's profile one its backend accepts (its
// ParseProfile).
func TestPoolsDocExamples(t *testing.T) {
	keys, err := taskassignment.NewKeys("gitea-dynamic-runner.io")
	if err != nil {
		t.Fatal(err)
	}
	for doc, least := range map[string]int{poolsDoc: 5, "../README.md": 1} {
		data, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		blocks := yamlBlocks(string(data))
		if len(blocks) < least {
			t.Fatalf("%s has %d yaml blocks: the parse is wrong", doc, len(blocks))
		}
		checkPoolsBlocks(t, doc, blocks, keys)
	}
}

func checkPoolsBlocks(t *testing.T, doc string, blocks []string, keys taskassignment.Keys) {
	t.Helper()
	for i, b := range blocks {
		b = strings.TrimPrefix(strings.TrimSuffix(b, "```"), "```yaml\n")
		pools, err := runnerpool.Parse([]byte(b), t.TempDir())
		if err != nil {
			t.Errorf("%s's yaml block %d: %v\n%s", doc, i+1, err, b)
			continue
		}
		for _, p := range pools {
			switch p.Backend {
			case taskassignment.BackendPod:
				_, err = pod.ParseProfile(p.Profile, keys)
			case taskassignment.BackendOpenSandbox:
				_, err = opensandbox.ParseProfile(p.Profile)
			case taskassignment.BackendProcess:
				if len(p.Profile) != 0 {
					err = errors.New("the process backend takes no profile")
				}
			}
			if err != nil {
				t.Errorf("%s's yaml block %d, pool %s: %v", doc, i+1, p.Name, err)
			}
		}
	}
}

// jsonFields returns the json field names of t and of the struct types below it, stopping at
// what Kubernetes documents (a Pod template, a duration) and at raw values.
func jsonFields(t reflect.Type, into map[string]bool) {
	switch t {
	case reflect.TypeOf(corev1.PodTemplateSpec{}), reflect.TypeOf(metav1.Duration{}), reflect.TypeOf(json.RawMessage{}):
		return
	}
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Map:
		jsonFields(t.Elem(), into)
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !f.IsExported() || name == "-" || name == "" {
				continue
			}
			into[name] = true
			jsonFields(f.Type, into)
		}
	}
}

// TestPoolsDocNamesEveryField: every field a pools file may hold (the pool's, its images', and
// each backend's profile's, nested ones included) is named in docs/POOLS.md, in backquotes.
func TestPoolsDocNamesEveryField(t *testing.T) {
	data, err := os.ReadFile(poolsDoc)
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]bool{}
	for _, typ := range []reflect.Type{reflect.TypeOf(runnerpool.Pool{}), reflect.TypeOf(pod.Profile{}), reflect.TypeOf(opensandbox.Profile{})} {
		jsonFields(typ, fields)
	}
	if !fields["pullPolicy"] || !fields["userNamespace"] || !fields["poolRef"] || len(fields) < 30 {
		t.Fatalf("found fields %v: the walk is wrong", fields)
	}
	for f := range fields {
		if !strings.Contains(string(data), "`"+f+"`") {
			t.Errorf("docs/POOLS.md does not name the pools file's field %s", f)
		}
	}
}
