package function

import (
	"crypto/subtle"
	"net/http"
	"strings"
)

// HeaderTickToken is the header a Knative PingSource sends the token in: the
// CloudEvents extension "gdrtoken" (spec.ceOverrides.extensions), which
// binary mode carries as Ce-Gdrtoken. A PingSource cannot set Authorization.
const HeaderTickToken = "Ce-Gdrtoken"

// TickSettings is embedded in the configuration of the functions a schedule ticks
// over HTTP (dispatch serve, recover in http mode).
type TickSettings struct {
	TickToken string `envconfig:"GDR_TICK_TOKEN" desc:"bearer token a schedule tick (POST /) must carry; empty: ticks are refused"`
}

// Authorized admits a tick that carries the token, as "Authorization:
// Bearer <token>" or in HeaderTickToken, compared in constant time; any
// other request is 401 without its body being read. With no token
// configured every tick is refused: a tick starts work, and nobody may start
// it unauthenticated.
func (t TickSettings) Authorized(next http.Handler) http.Handler {
	want := []byte(t.TickToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := r.Header.Get(HeaderTickToken)
		if bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			got = bearer
		}
		if len(want) == 0 || subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tick"`)
			http.Error(w, "tick refused: missing or wrong token", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
