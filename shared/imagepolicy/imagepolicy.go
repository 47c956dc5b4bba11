// Package imagepolicy is a runner pool's rule for the images its jobs choose:
// a job's `container:` image and its `services:` images come from the
// workflow, that is from whoever can push to the repository, and are pulled
// with the pool's credentials onto nodes that other pools' jobs share. A
// Policy says which of those images a pool runs (patterns, as GitLab
// Runner's allowed_images and allowed_services) and how the executor pulls
// them.
//
// The invariant a backend relies on: an image Check accepted matches one of
// the pool's patterns in its written or its fully normalized form (so
// "node:*" admits "node:22" and "docker.io/library/node:22", and nothing on
// another registry), and is a valid image reference. The images the
// operator put in the pool's own template are not the job's and are not
// checked.
package imagepolicy

import (
	"errors"
	"fmt"
	"strings"

	"github.com/bmatcuk/doublestar/v4"
	"github.com/distribution/reference"
)

// PullPolicy is how an executor pulls a job-chosen image (Kubernetes'
// imagePullPolicy values).
type PullPolicy string

const (
	// PullAlways makes the node check the registry with the pool's own
	// credentials on every start: an image another pool pulled onto the
	// node (a private one, with credentials this pool lacks) is never run
	// from the node's cache. The default.
	PullAlways PullPolicy = "Always"
	// PullIfNotPresent runs a cached image as it is: for nodes whose images
	// are put there beforehand, where every pool sharing the node may run
	// every image on it.
	PullIfNotPresent PullPolicy = "IfNotPresent"
	// PullNever runs only images already on the node.
	PullNever PullPolicy = "Never"
)

// Policy is the `images` block of a runner pool:
//
//	images:
//	  allowed: ["node:*", "ghcr.io/acme/**"]   # container: images; absent: any image
//	  services: ["postgres:*", "redis:*"]      # services: images; absent: as allowed
//	  pullPolicy: Always                       # Always (default), IfNotPresent, Never
//
// Patterns are doublestar globs over image references: `*` matches within
// one path segment (a tag included: "node:*"), `**` across segments, `{a,b}`
// alternatives. An empty list (`allowed: []`) admits no image: jobs of the
// pool run in the template's own image and may have no services.
type Policy struct {
	Allowed    *[]string  `json:"allowed,omitempty"`
	Services   *[]string  `json:"services,omitempty"`
	PullPolicy PullPolicy `json:"pullPolicy,omitempty"`
}

// Validate checks every pattern and the pull policy; errors name the field.
func (p Policy) Validate() error {
	for field, list := range map[string]*[]string{"images.allowed": p.Allowed, "images.services": p.Services} {
		if list == nil {
			continue
		}
		for _, pat := range *list {
			if pat == "" || !doublestar.ValidatePattern(pat) {
				return fmt.Errorf("%s: %q is not a valid pattern", field, pat)
			}
		}
	}
	switch p.PullPolicy {
	case "", PullAlways, PullIfNotPresent, PullNever:
		return nil
	default:
		return fmt.Errorf("images.pullPolicy: %q is not Always, IfNotPresent or Never", p.PullPolicy)
	}
}

// Pull is the pull policy for job-chosen images: PullPolicy, or PullAlways.
func (p Policy) Pull() PullPolicy {
	if p.PullPolicy == "" {
		return PullAlways
	}
	return p.PullPolicy
}

// ErrRefused marks an image the policy does not admit.
var ErrRefused = errors.New("image not allowed")

// CheckContainer checks a job's `container:` image. The error wraps
// ErrRefused and names the image and the rule, in words for the job's log.
func (p Policy) CheckContainer(image string) error {
	return check(image, p.Allowed, "container image", "images.allowed")
}

// CheckService checks the image of the job's service id against Services
// (or Allowed when Services is absent).
func (p Policy) CheckService(id, image string) error {
	list, field := p.Services, "images.services"
	if list == nil {
		list, field = p.Allowed, "images.allowed"
	}
	return check(image, list, "service "+id+": image", field)
}

func check(image string, patterns *[]string, what, field string) error {
	if patterns == nil {
		return nil
	}
	forms, err := forms(image)
	if err != nil {
		return fmt.Errorf("%s %q: %w: %w", what, image, ErrRefused, err)
	}
	for _, pat := range *patterns {
		for _, f := range forms {
			if doublestar.MatchUnvalidated(pat, f) {
				return nil
			}
		}
	}
	if len(*patterns) == 0 {
		return fmt.Errorf("%s %q: %w: the runner pool's %s is empty, so its jobs may not choose images", what, image, ErrRefused, field)
	}
	return fmt.Errorf("%s %q: %w: it matches none of the runner pool's %s [%s]", what, image, ErrRefused, field, strings.Join(*patterns, ", "))
}

// forms are the ways a pattern may name image: as written with the tag
// made explicit ("node:latest") and fully normalized
// ("docker.io/library/node:latest").
func forms(image string) ([]string, error) {
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return nil, fmt.Errorf("not an image reference: %w", err)
	}
	named = reference.TagNameOnly(named)
	return []string{reference.FamiliarString(named), named.String()}, nil
}
