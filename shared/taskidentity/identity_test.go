package taskidentity

import (
	"strings"
	"testing"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/types/known/structpb"
)

var td = spiffeid.RequireTrustDomainFromString("ci.example.org")

func TestNew(t *testing.T) {
	tests := []struct {
		name       string
		repository string
		job        string
		taskID     int64
		want       string
		wantErr    string
	}{
		{"lower-cases owner and name", "Alice/My-Repo.go", "build", 42, "spiffe://ci.example.org/repo/alice/my-repo.go/task/42", ""},
		{"underscore kept", "org_1/repo_2", "test", 7, "spiffe://ci.example.org/repo/org_1/repo_2/task/7", ""},
		{"no slash", "alice", "build", 1, "", "not owner/name"},
		{"two slashes", "a/b/c", "build", 1, "", "not owner/name"},
		{"empty owner", "/b", "build", 1, "", "not owner/name"},
		{"space in name", "alice/my repo", "build", 1, "", "repository"},
		{"dot-dot name", "alice/..", "build", 1, "", "repository"},
		{"zero task", "alice/repo", "build", 0, "", "not positive"},
		{"no job key", "alice/repo", "", 1, "", "no job key"},
		{"too long", "alice/" + strings.Repeat("r", 250), "build", 1, "", "more than 255"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := New(td, tt.repository, tt.job, tt.taskID)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("New() error = %v, want it to mention %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.SPIFFEID != tt.want || got.Repository != tt.repository || got.Task != tt.job {
				t.Fatalf("New() = %+v, want SPIFFE ID %s", got, tt.want)
			}
		})
	}
}

func TestNewRejectsZeroTrustDomain(t *testing.T) {
	if _, err := New(spiffeid.TrustDomain{}, "a/b", "j", 1); err == nil {
		t.Fatal("New with a zero trust domain succeeded")
	}
}

func TestFromTask(t *testing.T) {
	ctx, err := structpb.NewStruct(map[string]any{"repository": "Owner/Repo", "job": "lint", "token": "secret-token"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := FromTask(td, &runnerv1.Task{Id: 99, Context: ctx})
	if err != nil {
		t.Fatal(err)
	}
	want := Identity{Repository: "Owner/Repo", Task: "lint", SPIFFEID: "spiffe://ci.example.org/repo/owner/repo/task/99"}
	if got != want {
		t.Fatalf("FromTask() = %+v, want %+v", got, want)
	}
	if _, err := FromTask(td, &runnerv1.Task{Id: 99}); err == nil || !strings.Contains(err.Error(), "no repository") {
		t.Fatalf("FromTask without context: err = %v", err)
	}
	if _, err := FromTask(td, nil); err == nil {
		t.Fatal("FromTask(nil) succeeded")
	}
}

func TestFromMetadata(t *testing.T) {
	good := "spiffe://ci.example.org/repo/alice/repo/task/5"
	tests := []struct {
		name       string
		repository string
		taskID     int64
		spiffeID   string
		wantErr    string
	}{
		{"match", "Alice/Repo", 5, good, ""},
		{"other trust domain", "alice/repo", 5, "spiffe://evil.example.org/repo/alice/repo/task/5", "outside trust domain"},
		{"other task", "alice/repo", 6, good, "does not match"},
		{"other repository", "alice/other", 5, good, "does not match"},
		{"not a SPIFFE ID", "alice/repo", 5, "https://ci.example.org/x", "SPIFFE ID"},
		{"empty", "alice/repo", 5, "", "no SPIFFE ID"},
		{"trailing slash", "alice/repo", 5, good + "/", "SPIFFE ID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := FromMetadata(td, tt.repository, "build", tt.taskID, tt.spiffeID)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("FromMetadata() error = %v, want it to mention %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got.SPIFFEID != tt.spiffeID {
				t.Fatalf("FromMetadata() = %+v, %v", got, err)
			}
		})
	}
}

func TestParse(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("ci.example.org")
	built, err := New(td, "Alice/Repo", "build", 42)
	if err != nil {
		t.Fatal(err)
	}
	repo, task, err := Parse(td, spiffeid.RequireFromString(built.SPIFFEID))
	if err != nil || repo != "alice/repo" || task != 42 {
		t.Fatalf("Parse(New(...)) = %q, %d, %v; want alice/repo, 42", repo, task, err)
	}
	for _, tc := range []struct{ name, id string }{
		{"other trust domain", "spiffe://evil.example.org/repo/alice/repo/task/42"},
		{"not a task", "spiffe://ci.example.org/gateway"},
		{"too deep", "spiffe://ci.example.org/repo/alice/repo/task/42/x"},
		{"no repo segment", "spiffe://ci.example.org/rep/alice/repo/task/42"},
		{"zero task", "spiffe://ci.example.org/repo/alice/repo/task/0"},
		{"negative task", "spiffe://ci.example.org/repo/alice/repo/task/-4"},
		{"leading zero", "spiffe://ci.example.org/repo/alice/repo/task/042"},
		{"not a number", "spiffe://ci.example.org/repo/alice/repo/task/x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := Parse(td, spiffeid.RequireFromString(tc.id)); err == nil {
				t.Fatalf("Parse(%s) succeeded", tc.id)
			}
		})
	}
}
