package deploy

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// serviceAccounts are the ServiceAccount of each function (deploy/REFERENCE.md, "Kubernetes RBAC").
// Only handle and recover have Roles; the gateway's name is what its SPIRE entry selects.
var serviceAccounts = map[string]string{
	"handle":   "gitea-dynamic-runner-handle",
	"recover":  "gitea-dynamic-runner-recover",
	"dispatch": "gitea-dynamic-runner-dispatch",
	"gateway":  "gitea-dynamic-runner-gateway",
}

// apiAccess are the ServiceAccounts the pod backend runs as.
var apiAccess = []string{"gitea-dynamic-runner-handle", "gitea-dynamic-runner-recover"}

// permission is one (API group, resource, verb) an identity may use or used; a subresource is
// part of the resource ("pods/binding").
type permission struct {
	group, resource, verb string
}

func (p permission) String() string {
	if p.group == "" {
		return p.verb + " " + p.resource
	}
	return p.verb + " " + p.resource + "." + p.group
}

// rbacObjects are the RBAC documents of a built or loaded install, decoded.
type rbacObjects struct {
	accounts            []corev1.ServiceAccount
	roles               []rbacv1.Role
	roleBindings        []rbacv1.RoleBinding
	clusterRoles        []rbacv1.ClusterRole
	clusterRoleBindings []rbacv1.ClusterRoleBinding
}

// rbacDocs decodes the RBAC documents of docs strictly.
func rbacDocs(t *testing.T, docs []doc) rbacObjects {
	t.Helper()
	var out rbacObjects
	for _, d := range docs {
		var err error
		switch d.kind() {
		case "ServiceAccount":
			var o corev1.ServiceAccount
			err = strict(d.raw, &o)
			out.accounts = append(out.accounts, o)
		case "Role":
			var o rbacv1.Role
			err = strict(d.raw, &o)
			out.roles = append(out.roles, o)
		case "RoleBinding":
			var o rbacv1.RoleBinding
			err = strict(d.raw, &o)
			out.roleBindings = append(out.roleBindings, o)
		case "ClusterRole":
			var o rbacv1.ClusterRole
			err = strict(d.raw, &o)
			out.clusterRoles = append(out.clusterRoles, o)
		case "ClusterRoleBinding":
			var o rbacv1.ClusterRoleBinding
			err = strict(d.raw, &o)
			out.clusterRoleBindings = append(out.clusterRoleBindings, o)
		}
		if err != nil {
			t.Fatalf("%s: %v", d, err)
		}
	}
	return out
}

func bindsAccount(subjects []rbacv1.Subject, ns, account string) bool {
	for _, s := range subjects {
		// An empty subject namespace is what the files hold: kustomize fills it in.
		if s.Kind == rbacv1.ServiceAccountKind && s.Name == account && (s.Namespace == ns || s.Namespace == "") {
			return true
		}
	}
	return false
}

// granted returns what the ServiceAccount ns/account may do under objs, by namespace (Roles,
// bound in the RoleBinding's namespace; "" for the files' documents, which carry none) and
// cluster-wide (ClusterRoles), and problems: wildcards, resourceNames, non-resource URLs, a
// missing role, which least privilege has no use for here.
func (objs rbacObjects) granted(ns, account string) (namespaced map[string]map[permission]bool, cluster map[permission]bool, problems []string) {
	namespaced, cluster = map[string]map[permission]bool{}, map[permission]bool{}
	in := func(ns string) map[permission]bool {
		if namespaced[ns] == nil {
			namespaced[ns] = map[permission]bool{}
		}
		return namespaced[ns]
	}
	expand := func(where string, rules []rbacv1.PolicyRule, into map[permission]bool) {
		for _, r := range rules {
			if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
				problems = append(problems, fmt.Sprintf("%s: resourceNames or nonResourceURLs", where))
			}
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						if g == "*" || res == "*" || v == "*" {
							problems = append(problems, fmt.Sprintf("%s: wildcard in %q %q %q", where, g, res, v))
						}
						into[permission{g, res, v}] = true
					}
				}
			}
		}
	}
	for _, b := range objs.roleBindings {
		if !bindsAccount(b.Subjects, ns, account) {
			continue
		}
		where := "RoleBinding " + b.Name
		found := false
		switch b.RoleRef.Kind {
		case "Role":
			for _, r := range objs.roles {
				if r.Name == b.RoleRef.Name && r.Namespace == b.Namespace {
					expand(where+" -> Role "+r.Name, r.Rules, in(b.Namespace))
					found = true
				}
			}
		case "ClusterRole":
			for _, r := range objs.clusterRoles {
				if r.Name == b.RoleRef.Name {
					expand(where+" -> ClusterRole "+r.Name, r.Rules, in(b.Namespace))
					found = true
				}
			}
		}
		if !found {
			problems = append(problems, fmt.Sprintf("%s: %s %s is not in the manifests", where, b.RoleRef.Kind, b.RoleRef.Name))
		}
	}
	for _, b := range objs.clusterRoleBindings {
		if !bindsAccount(b.Subjects, ns, account) {
			continue
		}
		found := false
		for _, r := range objs.clusterRoles {
			if r.Name == b.RoleRef.Name && b.RoleRef.Kind == "ClusterRole" {
				expand("ClusterRoleBinding "+b.Name+" -> ClusterRole "+r.Name, r.Rules, cluster)
				found = true
			}
		}
		if !found {
			problems = append(problems, fmt.Sprintf("ClusterRoleBinding %s: ClusterRole %s is not in the manifests", b.Name, b.RoleRef.Name))
		}
	}
	return namespaced, cluster, problems
}

// unusedGrants returns, sorted, the permissions in granted that no call in used needed: a grant
// least privilege would drop.
func unusedGrants(granted, used map[permission]bool) []string {
	var out []string
	for p := range granted {
		if !used[p] {
			out = append(out, p.String())
		}
	}
	sort.Strings(out)
	return out
}

// TestServiceAccounts checks the identities: every control-plane Pod of both install paths runs
// as its function's ServiceAccount, defined in base; dispatch and the gateway get no token and
// no binding at all; only handle and recover are bound.
func TestServiceAccounts(t *testing.T) {
	docs := loadManifests(t)
	objs := rbacDocs(t, under(docs, "base"))
	accounts := map[string]corev1.ServiceAccount{}
	for _, a := range objs.accounts {
		accounts[a.Name] = a
	}
	for fn, name := range serviceAccounts {
		a, ok := accounts[name]
		if !ok {
			t.Errorf("no ServiceAccount %s for %s in base", name, fn)
			continue
		}
		api := slices.Contains(apiAccess, name)
		if !api && (a.AutomountServiceAccountToken == nil || *a.AutomountServiceAccountToken) {
			t.Errorf("ServiceAccount %s: automountServiceAccountToken must be false (%s does not use the Kubernetes API)", name, fn)
		}
		namespaced, cluster, problems := objs.granted(installNamespace, name)
		if api != (len(namespaced[""])+len(cluster) > 0) {
			t.Errorf("ServiceAccount %s (%s): %d grants, want some only for %v", name, fn, len(namespaced[""])+len(cluster), apiAccess)
		}
		if len(problems) > 0 {
			t.Errorf("ServiceAccount %s: %s", name, strings.Join(problems, "; "))
		}
	}
	if len(accounts) != len(serviceAccounts) {
		t.Errorf("ServiceAccounts %v, want exactly those of %v", slices.Sorted(func(yield func(string) bool) {
			for n := range accounts {
				if !yield(n) {
					return
				}
			}
		}), serviceAccounts)
	}
	for _, dir := range kustomizations {
		for _, p := range podTemplates(t, installed(docs, dir)) {
			fn := p.function()
			if fn == "executor" {
				if p.spec.ServiceAccountName != "" {
					t.Errorf("%s: an executor runs as ServiceAccount %q; it must not hold any identity of the control plane", p, p.spec.ServiceAccountName)
				}
				continue
			}
			if want := serviceAccounts[fn]; p.spec.ServiceAccountName != want {
				t.Errorf("%s: serviceAccountName %q, want %q (%s)", p, p.spec.ServiceAccountName, want, fn)
			}
		}
	}
}

// TestUnusedGrantsBites feeds the grant checks a role with a verb nobody used, and bindings that
// leave a grant out or widen it.
func TestUnusedGrantsBites(t *testing.T) {
	const ns, sa = "x", "gitea-dynamic-runner-handle"
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa}}
	objs := func(podVerbs ...string) rbacObjects {
		return rbacObjects{
			roles:        []rbacv1.Role{{Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: podVerbs}}}},
			roleBindings: []rbacv1.RoleBinding{{Subjects: subject, RoleRef: rbacv1.RoleRef{Kind: "Role"}}},
		}
	}
	used := map[permission]bool{{"", "pods", "get"}: true, {"", "pods", "list"}: true}
	for _, tc := range []struct {
		name     string
		objs     rbacObjects
		unused   []string
		problems int
	}{
		{"exact", objs("get", "list"), nil, 0},
		{"one verb too many", objs("get", "list", "watch"), []string{"watch pods"}, 0},
		{"wildcard", objs("*"), []string{"* pods"}, 1},
		{"a Role of another namespace", rbacObjects{roles: []rbacv1.Role{{ObjectMeta: metav1.ObjectMeta{Namespace: "elsewhere"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}}}},
			roleBindings: objs().roleBindings}, nil, 1},
		{"another account's binding", rbacObjects{roles: objs("patch").roles,
			roleBindings: []rbacv1.RoleBinding{{Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "other"}}}}}, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			namespaced, _, problems := tc.objs.granted(ns, sa)
			if got := unusedGrants(namespaced[""], used); !slices.Equal(got, tc.unused) {
				t.Errorf("unused %v, want %v", got, tc.unused)
			}
			if len(problems) != tc.problems {
				t.Errorf("problems %v, want %d", problems, tc.problems)
			}
		})
	}
}

// keysOf is m's permissions, sorted.
func keysOf(m map[permission]bool) []string {
	var out []string
	for p := range m {
		out = append(out, p.String())
	}
	slices.Sort(out)
	return out
}
