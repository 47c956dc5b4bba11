package imagepolicy_test

import (
	"errors"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/imagepolicy"
)

func parse(t *testing.T, text string) imagepolicy.Policy {
	t.Helper()
	var p imagepolicy.Policy
	if err := yaml.UnmarshalStrict([]byte(text), &p); err != nil {
		t.Fatal(err)
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCheckContainer(t *testing.T) {
	acme := `allowed: ["node:*", "ghcr.io/acme/**", "docker.io/library/{alpine,busybox}:*"]`
	tests := []struct {
		name, policy, image string
		refused             string // "" = admitted; else a part of the error
	}{
		{"absent list admits any image", ``, "evil.example.com/x/y:1", ""},
		{"tag pattern, written form", acme, "node:22", ""},
		{"tag pattern, normalized form", acme, "docker.io/library/node:22", ""},
		{"untagged is latest", acme, "node", ""},
		{"doublestar across segments", acme, "ghcr.io/acme/team/tool:v1", ""},
		{"alternatives on the normalized form", acme, "alpine:3.20", ""},
		{"same name on another registry", acme, "evil.example.com/node:22", `matches none of the runner pool's images.allowed [node:*, ghcr.io/acme/**`},
		{"another owner on the registry", acme, "ghcr.io/other/tool:v1", "matches none"},
		{"single star stays in its segment", `allowed: ["ghcr.io/acme/*"]`, "ghcr.io/acme/team/tool:v1", "matches none"},
		{"digest references need a pattern that admits them", acme, "node@sha256:" + strings.Repeat("a", 64), "matches none"},
		{"digest admitted by a name pattern", `allowed: ["node*"]`, "node@sha256:" + strings.Repeat("a", 64), ""},
		{"empty list admits none", `allowed: []`, "node:22", "images.allowed is empty"},
		{"not a reference", acme, "Node:22", "not an image reference"},
		{"an expression is not a reference", acme, "${{ matrix.image }}", "not an image reference"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := parse(t, tt.policy).CheckContainer(tt.image)
			switch {
			case tt.refused == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.refused != "" && err == nil:
				t.Fatal("admitted")
			case tt.refused != "":
				if !errors.Is(err, imagepolicy.ErrRefused) || !strings.Contains(err.Error(), tt.refused) || !strings.Contains(err.Error(), tt.image) {
					t.Fatalf("error %q: want ErrRefused naming the image and %q", err, tt.refused)
				}
			}
		})
	}
}

func TestCheckServiceFallsBackToAllowed(t *testing.T) {
	both := parse(t, `{allowed: ["node:*"], services: ["postgres:*"]}`)
	if err := both.CheckService("db", "postgres:17"); err != nil {
		t.Errorf("postgres refused: %v", err)
	}
	err := both.CheckService("db", "node:22")
	if err == nil || !strings.Contains(err.Error(), "service db: image \"node:22\"") || !strings.Contains(err.Error(), "images.services [postgres:*]") {
		t.Errorf("a container pattern admitted a service, or the error does not name the service and rule: %v", err)
	}
	only := parse(t, `{allowed: ["node:*"]}`)
	if err := only.CheckService("web", "redis:7"); err == nil || !strings.Contains(err.Error(), "images.allowed") {
		t.Errorf("without services, allowed applies to services: %v", err)
	}
}

func TestValidate(t *testing.T) {
	for text, want := range map[string]string{
		`{allowed: ["node:[", "x"]}`: `images.allowed: "node:[" is not a valid pattern`,
		`{services: [""]}`:           `images.services: "" is not a valid pattern`,
		`{pullPolicy: Sometimes}`:    `images.pullPolicy: "Sometimes"`,
	} {
		var p imagepolicy.Policy
		if err := yaml.UnmarshalStrict([]byte(text), &p); err != nil {
			t.Fatal(err)
		}
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: Validate = %v, want %q", text, err, want)
		}
	}
}

func TestPullDefaultsToAlways(t *testing.T) {
	if got := (imagepolicy.Policy{}).Pull(); got != imagepolicy.PullAlways {
		t.Errorf("default pull policy %q, want Always", got)
	}
	if got := parse(t, `pullPolicy: IfNotPresent`).Pull(); got != imagepolicy.PullIfNotPresent {
		t.Errorf("pull policy %q, want IfNotPresent", got)
	}
}
