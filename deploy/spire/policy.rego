# SPIRE Server authorization policy (auth_opa_policy_engine) for
# gitea-dynamic-runner: SPIRE v1.13.3's default policy, unchanged, plus the
# rules below, for callers that reach the TCP API with their own SVID and are
# NOT admins (neither in admin_ids nor on the local socket):
#   - data.gitea_dynamic_runner.minters (handle of the pod backend with
#     GDR_POD_IDENTITY=minted, handle of the opensandbox backend)
#     may call MintX509SVID for task identities only: a CSR whose one URI SAN
#     is spiffe://<trust_domain>/repo/..., with no DNS, IP or e-mail SAN, and
#     a TTL of at most max_ttl_seconds;
#   - data.gitea_dynamic_runner.registrars (handle and recover of the pod
#     backend) may create, read and delete task registration entries only:
#     entry IDs under entry_id_prefix, SPIFFE IDs spiffe://<trust_domain>/repo/...,
#     parented by an agent of the trust domain, selected by exactly two k8s
#     selectors, a pod-uid and the namespace, one of executor_namespaces
#     (where the pod backend runs executors), never admin or downstream,
#     with no DNS names, federation or stored SVID, X509-SVID and JWT-SVID
#     TTLs of at most max_ttl_seconds (0: the server's default) and an
#     expiry, required, at most max_ttl_seconds + max_clock_skew_seconds
#     from the server's clock (the registrar's clock may be ahead). recover
#     needs create too: its Worker.Handle binds running executors' identities.
# Neither can mint or register any other identity (not the gateway's), touch
# an entry the operator made, write a bundle or call any other admin API.
# GetBundle is open to any caller by the default policy. See deploy/REFERENCE.md.
package spire

result = {
  "allow": allow,
  "allow_if_admin": allow_if_admin,
  "allow_if_local": allow_if_local,
  "allow_if_downstream": allow_if_downstream,
  "allow_if_agent": allow_if_agent,
}

### DEFAULT POLICY START (SPIRE v1.13.3 pkg/server/authpolicy/policy.rego) ###

default allow_if_admin = false
default allow_if_downstream = false
default allow_if_local = false
default allow_if_agent = false
default allow = false

allow_if_admin = true if {
    r := data.apis[_]
    r.full_method == input.full_method
    r.allow_admin
}

allow_if_local = true if {
    r := data.apis[_]
    r.full_method == input.full_method
    r.allow_local
}

allow_if_downstream = true if {
    r := data.apis[_]
    r.full_method == input.full_method
    r.allow_downstream
}

allow_if_agent = true if {
    r := data.apis[_]
    r.full_method == input.full_method
    r.allow_agent
}

allow = true if {
    r := data.apis[_]
    r.full_method == input.full_method
    r.allow_any
}

### DEFAULT POLICY END ###

# gitea-dynamic-runner: task SVIDs for executor Pods and sandboxes, minted by handle.
allow = true if {
    input.full_method == "/spire.api.server.svid.v1.SVID/MintX509SVID"
    gdr := data.gitea_dynamic_runner
    input.caller == gdr.minters[_]
    input.req.ttl > 0
    input.req.ttl <= gdr.max_ttl_seconds
    csr := crypto.x509.parse_certificate_request(input.req.csr)
    count(csr.URIs) == 1
    every san in ["DNSNames", "IPAddresses", "EmailAddresses"] {
        object.get(csr, san, null) in {null, []}
    }
    uri := csr.URIs[0]
    uri.Scheme == "spiffe"
    uri.Host == gdr.trust_domain
    startswith(uri.Path, "/repo/")
}

# gitea-dynamic-runner: task registration entries for executor Pods, created
# by handle and deleted by recover (pod backend). A batch is allowed only if
# every entry in it is a task entry.
allow = true if {
    input.full_method == "/spire.api.server.entry.v1.Entry/BatchCreateEntry"
    gdr := data.gitea_dynamic_runner
    input.caller == gdr.registrars[_]
    count(input.req.entries) > 0
    every e in input.req.entries {
        task_entry(e, gdr)
    }
}

allow = true if {
    input.full_method == "/spire.api.server.entry.v1.Entry/GetEntry"
    gdr := data.gitea_dynamic_runner
    input.caller == gdr.registrars[_]
    startswith(input.req.id, gdr.entry_id_prefix)
}

allow = true if {
    input.full_method == "/spire.api.server.entry.v1.Entry/BatchDeleteEntry"
    gdr := data.gitea_dynamic_runner
    input.caller == gdr.registrars[_]
    count(input.req.ids) > 0
    every id in input.req.ids {
        startswith(id, gdr.entry_id_prefix)
    }
}

task_entry(e, gdr) if {
    startswith(e.id, gdr.entry_id_prefix)
    e.spiffe_id.trust_domain == gdr.trust_domain
    startswith(e.spiffe_id.path, "/repo/")
    e.parent_id.trust_domain == gdr.trust_domain
    startswith(e.parent_id.path, "/spire/agent/")
    not e.admin
    not e.downstream
    not e.store_svid
    object.get(e, "dns_names", []) == []
    object.get(e, "federates_with", []) == []
    svid_ttl(object.get(e, "x509_svid_ttl", 0), gdr)
    svid_ttl(object.get(e, "jwt_svid_ttl", 0), gdr)
    e.expires_at > 0
    e.expires_at <= (time.now_ns() / 1000000000) + gdr.max_ttl_seconds + gdr.max_clock_skew_seconds
    count(e.selectors) == 2
    every s in e.selectors {
        s.type == "k8s"
    }
    count([s | s := e.selectors[_]; startswith(s.value, "pod-uid:")]) == 1
    count([s | s := e.selectors[_]; s.value == concat("", ["ns:", gdr.executor_namespaces[_]])]) == 1
}

# An entry's SVID TTL: 0 (the server's default) up to the longest task TTL.
svid_ttl(ttl, gdr) if {
    ttl >= 0
    ttl <= gdr.max_ttl_seconds
}
