package gateway

import (
	"math"
	"net/http"
	"strings"

	"connectrpc.com/connect"
	runnerv1 "gitea.dev/actions-proto-go/runner/v1"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/actionscache"
)

// MaxBodyBytes is the body cap of the gateway's server: the runner
// protocol's MaxRequestBytes, or with a cache one uploaded chunk. Each route
// caps its own bodies below it.
func (g *Gateway) MaxBodyBytes() int64 {
	if g.Cache == nil {
		return MaxRequestBytes
	}
	return max(MaxRequestBytes, actionscache.MaxChunkBytes)
}

// cacheScoped admits a cache request whose TLS peer and headers authenticate
// (as the runner protocol's) and whose caller is bound to its task's
// payload, with the scope derived from that task in its context: the
// repository of the verified SVID (by Gitea's ID of it), the task's ref, its pull request's base
// and its repository's default branch. Nothing of the request chooses them.
// A refused request is answered before any byte of its body is read.
func (g *Gateway) cacheScoped(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := g.authenticate(peerID(r), r.Header)
		if err == nil {
			var task *runnerv1.Task
			if task, err = g.bound(r.Context(), c); err == nil {
				next.ServeHTTP(w, r.WithContext(actionscache.WithScope(r.Context(), cacheScope(task))))
				return
			}
		}
		status := http.StatusInternalServerError
		switch connect.CodeOf(err) {
		case connect.CodeUnauthenticated:
			status = http.StatusUnauthorized
		case connect.CodePermissionDenied:
			status = http.StatusForbidden
		case connect.CodeNotFound:
			status = http.StatusNotFound
		case connect.CodeUnavailable:
			status = http.StatusServiceUnavailable
		}
		w.Header().Set("Connection", "close") // an unread body is not drained
		http.Error(w, http.StatusText(status), status)
	})
}

// cacheScope is the cache scope of a task bound to its caller.
func cacheScope(task *runnerv1.Task) actionscache.Scope {
	fields := task.GetContext().GetFields()
	str := func(k string) string { return fields[k].GetStringValue() }
	branch := func(name string) string {
		if name == "" || strings.HasPrefix(name, "refs/") {
			return name
		}
		return "refs/heads/" + name
	}
	s := actionscache.Scope{Repository: strings.ToLower(str("repository")), Ref: str("ref"), BaseRef: branch(str("base_ref"))}
	if repo := fields["event"].GetStructValue().GetFields()["repository"].GetStructValue(); repo != nil {
		s.DefaultRef = branch(repo.GetFields()["default_branch"].GetStringValue())
		// Gitea's ID of the repository (the event payload's repository.id):
		// what the cache keeps entries under, so that a repository created
		// again by a deleted one's name inherits nothing. Absent or not a
		// positive integer: 0, which the cache refuses.
		if id := repo.GetFields()["id"].GetNumberValue(); id >= 1 && id <= 1<<53 && id == math.Trunc(id) {
			s.RepositoryID = int64(id)
		}
	}
	if s.Ref == "" {
		s.Ref = s.DefaultRef
	}
	return s
}
