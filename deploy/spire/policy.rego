# SPIRE Server authorization policy (auth_opa_policy_engine) for
# gitea-dynamic-runner: SPIRE v1.13.3's default policy, unchanged, plus one
# rule. It lets the callers in data.gitea_dynamic_runner.minters (handle of
# the opensandbox backend, over the TCP API with its own SVID) call
# MintX509SVID for task identities only: a CSR whose one URI SAN is
# spiffe://<trust_domain>/repo/..., with no DNS, IP or e-mail SAN, and a TTL
# of at most max_ttl_seconds. Those callers are not admins: they can mint no
# other identity (not the gateway's) and call no other admin API. GetBundle
# is open to any caller by the default policy. See deploy/README.md.
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

# gitea-dynamic-runner: task SVIDs for sandboxes, minted by handle.
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
