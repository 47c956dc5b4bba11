package deploy

import (
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// natsSecretDir is where every function mounts its gdr-nats-<user> Secret.
const natsSecretDir = "/var/run/secrets/gitea-dynamic-runner/nats"

// natsUser is the NATS user (deploy/nats/authorization.conf) a Pod template connects as, or ""
// for one that must hold no NATS credentials: executors, and handle in http mode (Knative: the
// channel's dispatcher talks to NATS, handle only to Kubernetes).
func natsUser(p podTemplate) string {
	switch f := p.function(); f {
	case "dispatch", "recover", "gateway":
		return f
	case "handle":
		env := p.env()
		switch env["GDR_MODE"].Value {
		case "setup":
			return "handle-setup"
		case "http":
			return ""
		default:
			return "handle-" + env["GDR_BACKEND"].Value
		}
	}
	return ""
}

// TestNATSCredentialsWiring checks that every function that talks to NATS reads its own user's
// nkey seed from its own Secret, mounted read-only, that the user exists in the authorization
// file, and that nothing else (executors above all) holds NATS credentials.
func TestNATSCredentialsWiring(t *testing.T) {
	conf := readAuthorization(t)
	users := map[string]bool{}
	for _, m := range regexp.MustCompile(`nkey:\s*\$NKEY_([A-Z_]+)`).FindAllStringSubmatch(conf, -1) {
		users[strings.ToLower(strings.ReplaceAll(m[1], "_", "-"))] = true
	}
	if len(users) != len(natsUsers) {
		t.Fatalf("authorization file users %v, want the %d of natsUsers", users, len(natsUsers))
	}
	seen := map[string]bool{}
	for _, p := range podTemplates(t, loadManifests(t)) {
		user := natsUser(p)
		env := p.env()
		var natsSecrets []corev1.Volume
		for _, v := range p.spec.Volumes {
			if v.Secret != nil && strings.HasPrefix(v.Secret.SecretName, "gdr-nats-") {
				natsSecrets = append(natsSecrets, v)
			}
		}
		if user == "" {
			for name := range env {
				if strings.HasPrefix(name, "GDR_NATS_") && name != "GDR_NATS_URL" {
					t.Errorf("%s: %s set, but %s does not talk to NATS", p, name, p.function())
				}
			}
			if len(natsSecrets) > 0 {
				t.Errorf("%s: mounts %s, but %s must hold no NATS credentials", p, natsSecrets[0].Secret.SecretName, p.function())
			}
			continue
		}
		seen[user] = true
		if !users[user] {
			t.Errorf("%s: NATS user %s is not in %s", p, user, authorizationFile)
		}
		if got := env["GDR_NATS_NKEY"]; got.Value != natsSecretDir+"/nkey" {
			t.Errorf("%s: GDR_NATS_NKEY %q, want %s/nkey", p, got.Value, natsSecretDir)
		}
		if len(natsSecrets) != 1 || natsSecrets[0].Secret.SecretName != "gdr-nats-"+user {
			t.Errorf("%s: want exactly the Secret gdr-nats-%s mounted, have %v", p, user, natsSecrets)
			continue
		}
		mounted := slices.ContainsFunc(p.spec.Containers[0].VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == natsSecrets[0].Name && filepath.Clean(m.MountPath) == natsSecretDir && m.ReadOnly
		})
		if !mounted {
			t.Errorf("%s: gdr-nats-%s is not mounted read-only at %s", p, user, natsSecretDir)
		}
		if mode := natsSecrets[0].Secret.DefaultMode; mode == nil || *mode&0o022 != 0 {
			t.Errorf("%s: gdr-nats-%s: want a defaultMode without write bits for group and others", p, user)
		}
	}
	for u := range users {
		if !seen[u] {
			t.Errorf("NATS user %s of %s is used by no manifest", u, authorizationFile)
		}
	}
}

// envFrom returns where a variable of p comes from: "secret:<name>/<key>",
// "configmap:<name>/<key>", "value:<v>" or "" when unset.
func envFrom(p podTemplate, name string) string {
	e, ok := p.env()[name]
	switch {
	case !ok:
		return ""
	case e.ValueFrom == nil:
		return "value:" + e.Value
	case e.ValueFrom.SecretKeyRef != nil:
		return "secret:" + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
	case e.ValueFrom.ConfigMapKeyRef != nil:
		return "configmap:" + e.ValueFrom.ConfigMapKeyRef.Name + "/" + e.ValueFrom.ConfigMapKeyRef.Key
	}
	return "other"
}

// TestAssignmentKeysWiring: only dispatch and recover hold the signing key; every handle
// that takes assignments checks them with the public verify keys.
func TestAssignmentKeysWiring(t *testing.T) {
	for _, p := range podTemplates(t, loadManifests(t)) {
		signing, verify := envFrom(p, "GDR_ASSIGNMENT_SIGNING_KEY"), envFrom(p, "GDR_ASSIGNMENT_VERIFY_KEYS")
		switch f := p.function(); f {
		case "dispatch", "recover":
			if signing != "secret:gdr-secrets/assignment-signing-key" {
				t.Errorf("%s: GDR_ASSIGNMENT_SIGNING_KEY from %q, want the Secret gdr-secrets key assignment-signing-key", p, signing)
			}
		default:
			if signing != "" {
				t.Errorf("%s: %s holds the assignment signing key", p, f)
			}
			if f == "handle" && natsUser(p) != "handle-setup" && verify != "configmap:gdr-assignment-verify-keys/verify-keys" {
				t.Errorf("%s: GDR_ASSIGNMENT_VERIFY_KEYS from %q, want the ConfigMap gdr-assignment-verify-keys key verify-keys", p, verify)
			}
		}
	}
}

// TestTickTokenWiring: a PingSource can only tick a Service with the tick token, which it
// carries as the CloudEvent extension gdrtoken (header Ce-Gdrtoken); the committed manifests
// hold a placeholder, never a token. Nothing ticks the KEDA dispatch, so it has no token and
// refuses ticks.
func TestTickTokenWiring(t *testing.T) {
	docs := loadManifests(t)
	ticked := map[string]bool{}
	for _, ps := range find(docs, "PingSource", "") {
		target, _ := path(ps.obj, "spec", "sink", "ref", "name").(string)
		ticked[target] = true
		if got := path(ps.obj, "spec", "ceOverrides", "extensions", "gdrtoken"); got != "${GDR_TICK_TOKEN}" {
			t.Errorf("%s: ceOverrides.extensions.gdrtoken = %v, want the placeholder ${GDR_TICK_TOKEN} (filled in at apply time)", ps, got)
		}
	}
	for _, p := range podTemplates(t, docs) {
		token := envFrom(p, "GDR_TICK_TOKEN")
		name := p.doc.name()
		switch {
		case p.knative && ticked[name]:
			if token != "secret:gdr-secrets/tick-token" {
				t.Errorf("%s: ticked by a PingSource, GDR_TICK_TOKEN from %q, want the Secret gdr-secrets key tick-token", p, token)
			}
		case token != "":
			t.Errorf("%s: GDR_TICK_TOKEN set, but no PingSource ticks it", p)
		}
	}
	if !ticked["recover"] || !ticked["dispatch"] {
		t.Errorf("PingSources tick %v, want recover and dispatch", ticked)
	}
}

// TestServicesSelectOnlyServingPods: a Service's selector matches the Pods of the workload that
// serves its port and no Pod of a Job or CronJob (dispatch-run's Pods carry dispatch's name but
// listen on nothing: a webhook routed to one is lost).
func TestServicesSelectOnlyServingPods(t *testing.T) {
	docs := under(loadManifests(t), "keda")
	docs = append(docs, under(loadManifests(t), "base")...)
	type pods struct {
		owner  doc
		labels map[string]any
	}
	var all []pods
	for _, d := range docs {
		var tmpl any
		switch d.kind() {
		case "Deployment", "Job", "StatefulSet", "DaemonSet":
			tmpl = path(d.obj, "spec", "template", "metadata", "labels")
		case "CronJob":
			tmpl = path(d.obj, "spec", "jobTemplate", "spec", "template", "metadata", "labels")
		case "ScaledJob":
			tmpl = path(d.obj, "spec", "jobTargetRef", "template", "metadata", "labels")
		default:
			continue
		}
		labels, _ := tmpl.(map[string]any)
		all = append(all, pods{d, labels})
	}
	for _, svc := range find(docs, "Service", "") {
		sel, _ := path(svc.obj, "spec", "selector").(map[string]any)
		if len(sel) == 0 {
			continue
		}
		var matched []string
		for _, p := range all {
			ok := true
			for k, v := range sel {
				ok = ok && p.labels[k] == v
			}
			if !ok {
				continue
			}
			matched = append(matched, p.owner.String())
			if k := p.owner.kind(); k != "Deployment" && k != "StatefulSet" && k != "DaemonSet" {
				t.Errorf("%s selects the Pods of %s, which serve nothing", svc, p.owner)
			}
		}
		if len(matched) == 0 {
			t.Errorf("%s selects no Pod of the manifests", svc)
		}
	}
}

// TestOldKeysWiring: wherever a Pod template takes the payload key, the bootstrap key or the
// webhook secret from gdr-secrets, it takes that secret's rotation list beside it from the same
// Secret, optional (an install that never rotated has no such key, and its Pods start), and no
// template takes a list without its secret (docs/OPERATIONS.md, "Rotating secrets", patches the
// Secret and restarts; it relies on every holder of a key reading its list).
func TestOldKeysWiring(t *testing.T) {
	pairs := []struct{ current, currentKey, old, oldKey string }{
		{"GDR_PAYLOAD_KEY", "payload-key", "GDR_PAYLOAD_OLD_KEYS", "payload-old-keys"},
		{"GDR_BOOTSTRAP_KEY", "bootstrap-key", "GDR_BOOTSTRAP_OLD_KEYS", "bootstrap-old-keys"},
		{"GDR_WEBHOOK_SECRET", "webhook-secret", "GDR_WEBHOOK_OLD_SECRETS", "webhook-old-secrets"},
	}
	seen := map[string]int{}
	for _, p := range podTemplates(t, loadManifests(t)) {
		env := p.env()
		for _, pr := range pairs {
			current, old := envFrom(p, pr.current), envFrom(p, pr.old)
			switch {
			case current == "" && old != "":
				t.Errorf("%s: %s set without %s", p, pr.old, pr.current)
			case current == "":
			case current != "secret:gdr-secrets/"+pr.currentKey:
				t.Errorf("%s: %s from %q, want the Secret gdr-secrets key %s", p, pr.current, current, pr.currentKey)
			case old != "secret:gdr-secrets/"+pr.oldKey:
				t.Errorf("%s: %s from %q, want the Secret gdr-secrets key %s beside %s", p, pr.old, old, pr.oldKey, pr.current)
			case env[pr.old].ValueFrom.SecretKeyRef.Optional == nil || !*env[pr.old].ValueFrom.SecretKeyRef.Optional:
				t.Errorf("%s: %s: want optional: true (an install that never rotated has no %s)", p, pr.old, pr.oldKey)
			default:
				seen[pr.old]++
			}
		}
	}
	// gateway, recover (its CronJob, finish ScaledJob, manual Jobs, Knative Service), dispatch
	// (KEDA and Knative) read the payload key; handle (setup, pod, Knative), recover and the
	// gateway the bootstrap key; dispatch (KEDA and Knative) the webhook secret.
	for old, least := range map[string]int{"GDR_PAYLOAD_OLD_KEYS": 8, "GDR_BOOTSTRAP_OLD_KEYS": 9, "GDR_WEBHOOK_OLD_SECRETS": 2} {
		if seen[old] < least {
			t.Errorf("%s wired in %d Pod templates, want at least %d", old, seen[old], least)
		}
	}
}
