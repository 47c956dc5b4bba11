package taskassignment

import (
	"maps"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func keys(t testing.TB) Keys {
	t.Helper()
	k, err := NewKeys("ci.example.org")
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestNewKeys(t *testing.T) {
	k := keys(t)
	if k.AssignmentID != "ci.example.org/assignment-id" || k.SPIFFEID != "ci.example.org/spiffe-id" {
		t.Fatalf("keys = %+v", k)
	}
	for _, bad := range []string{"", "CI.example.org", "ci.example.org/", "-ci.example.org", strings.Repeat("a", 254)} {
		if _, err := NewKeys(bad); err == nil {
			t.Errorf("NewKeys(%q) succeeded", bad)
		}
	}
}

func TestMetadataIsQuerySafe(t *testing.T) {
	k := keys(t)
	md := k.Metadata(sample(t))
	for key, value := range md.Labels {
		if errs := validation.IsQualifiedName(key); len(errs) > 0 {
			t.Errorf("label key %q: %v", key, errs)
		}
		if errs := validation.IsValidLabelValue(value); len(errs) > 0 {
			t.Errorf("label %s=%q: %v", key, value, errs)
		}
	}
	for key := range md.Annotations {
		if errs := validation.IsQualifiedName(key); len(errs) > 0 {
			t.Errorf("annotation key %q: %v", key, errs)
		}
	}
	for key, value := range k.RunnerSelector() {
		if md.Labels[key] != value {
			t.Errorf("metadata does not match the runner selector %s=%s", key, value)
		}
	}
}

func TestFromMetadataRoundTrip(t *testing.T) {
	k := keys(t)
	for _, image := range []string{"docker.io/library/golang:1.26", ""} {
		want := sample(t)
		want.Task.Image = image
		md := k.Metadata(want)
		got, err := k.FromMetadata(md.Labels, md.Annotations, td)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("FromMetadata(Metadata(a)) = %+v, want %+v", got, want)
		}
	}
}

func TestFromMetadataRejects(t *testing.T) {
	k := keys(t)
	md := k.Metadata(sample(t))
	for _, tc := range []struct {
		name    string
		edit    func(labels, annotations map[string]string)
		wantErr string
	}{
		{"missing runner marker", func(l, _ map[string]string) { delete(l, k.Runner) }, `label "ci.example.org/runner" is missing`},
		{"runner marker false", func(l, _ map[string]string) { l[k.Runner] = "false" }, "not \"true\""},
		{"missing assignment ID", func(l, _ map[string]string) { delete(l, k.AssignmentID) }, `label "ci.example.org/assignment-id" is missing`},
		{"missing task ID", func(l, _ map[string]string) { delete(l, k.TaskID) }, `label "ci.example.org/task-id" is missing`},
		{"missing backend", func(l, _ map[string]string) { delete(l, k.Backend) }, `label "ci.example.org/backend" is missing`},
		{"missing pool", func(l, _ map[string]string) { delete(l, k.Pool) }, `label "ci.example.org/pool" is missing`},
		{"missing repository", func(_, a map[string]string) { delete(a, k.Repository) }, `annotation "ci.example.org/repository" is missing`},
		{"missing job key", func(_, a map[string]string) { delete(a, k.Job) }, `annotation "ci.example.org/job-key" is missing`},
		{"missing SPIFFE ID", func(_, a map[string]string) { delete(a, k.SPIFFEID) }, `annotation "ci.example.org/spiffe-id" is missing`},
		{"empty assignment ID", func(l, _ map[string]string) { l[k.AssignmentID] = "" }, "is empty"},
		{"empty SPIFFE ID", func(_, a map[string]string) { a[k.SPIFFEID] = "" }, "is empty"},
		{"task ID not a number", func(l, _ map[string]string) { l[k.TaskID] = "forty-two" }, "is not a task ID"},
		{"task ID with leading zero", func(l, _ map[string]string) { l[k.TaskID] = "042" }, "is not a task ID"},
		{"task ID negative", func(l, _ map[string]string) { l[k.TaskID] = "-42" }, "is not a task ID"},
		{"task ID of another assignment", func(l, _ map[string]string) { l[k.TaskID] = "43" }, "does not match pool"},
		{"unknown backend", func(l, _ map[string]string) { l[k.Backend] = "vm" }, `unknown backend "vm"`},
		{"other trust domain", func(_, a map[string]string) {
			a[k.SPIFFEID] = "spiffe://evil.example.org/repo/alice/repo/task/42"
		}, "outside trust domain"},
		{"repository mismatch", func(_, a map[string]string) { a[k.Repository] = "mallory/repo" }, "does not match repository"},
		{"keys under another prefix", func(l, _ map[string]string) {
			for key, v := range l {
				delete(l, key)
				l[strings.Replace(key, "ci.example.org", "other.example.org", 1)] = v
			}
		}, "is missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			labels, annotations := maps.Clone(md.Labels), maps.Clone(md.Annotations)
			tc.edit(labels, annotations)
			_, err := k.FromMetadata(labels, annotations, td)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("FromMetadata() error = %v, want it to mention %q", err, tc.wantErr)
			}
		})
	}
	if _, err := k.FromMetadata(nil, nil, td); err == nil {
		t.Fatal("FromMetadata(nil, nil) succeeded")
	}
}

func FuzzFromMetadata(f *testing.F) {
	k := keys(f)
	md := k.Metadata(sample(f))
	l, a := md.Labels, md.Annotations
	f.Add(l[k.AssignmentID], l[k.TaskID], l[k.Backend], l[k.Pool], a[k.Repository], a[k.Job], a[k.SPIFFEID], a[k.Image])
	f.Add("x-1", "1", "process", "x", "a/b", "j", "spiffe://ci.example.org/repo/a/b/task/1", "")
	f.Fuzz(func(t *testing.T, id, taskID, backend, pool, repository, job, spiffeID, image string) {
		labels := map[string]string{k.Runner: "true", k.AssignmentID: id, k.TaskID: taskID, k.Backend: backend, k.Pool: pool}
		annotations := map[string]string{k.Repository: repository, k.Job: job, k.SPIFFEID: spiffeID, k.Image: image}
		got, err := k.FromMetadata(labels, annotations, td)
		if err != nil {
			return
		}
		if err := got.Validate(td); err != nil {
			t.Fatalf("FromMetadata accepted an invalid assignment %+v: %v", got, err)
		}
		// What is accepted must be persistable as-is and read back the same.
		again := k.Metadata(got)
		for key, value := range again.Labels {
			if errs := validation.IsValidLabelValue(value); len(errs) > 0 {
				t.Fatalf("accepted metadata gives label %s=%q: %v", key, value, errs)
			}
		}
		back, err := k.FromMetadata(again.Labels, again.Annotations, td)
		if err != nil || !reflect.DeepEqual(back, got) {
			t.Fatalf("round trip of %+v gave %+v, %v", got, back, err)
		}
	})
}
