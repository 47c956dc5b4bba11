package actionscache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
)

// PathPrefix is where the protocol lives, below ACTIONS_CACHE_URL.
const PathPrefix = "/_apis/artifactcache/"

// HeaderBase carries the ACTIONS_CACHE_URL the job was given (the runner's
// loopback proxy), which archive locations are built from. It must be an
// http URL of a loopback address: nothing else is ever handed to a job.
const HeaderBase = "X-Gdr-Cache-Base"

// Body caps: a JSON request, and one uploaded chunk (@actions/cache sends 32
// MiB by default and caps CACHE_UPLOAD_CHUNK_SIZE at 128 MiB).
const (
	MaxJSONBytes  = 64 << 10
	MaxChunkBytes = 128 << 20
)

// maxKeys bounds the keys of one lookup (GitHub allows 10).
const maxKeys = 10

type scopeKey struct{}

// WithScope returns ctx carrying the caller's scope, which the server
// derived from the caller's authenticated task.
func WithScope(ctx context.Context, s Scope) context.Context {
	return context.WithValue(ctx, scopeKey{}, s)
}

// Handler serves the cache protocol under PathPrefix for the scope in each
// request's context (WithScope); a request without one is 401.
func Handler(c *Cache, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := handler{c: c, log: log}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+PathPrefix+"cache", h.lookup)
	mux.HandleFunc("GET "+PathPrefix+"caches", h.list)
	mux.HandleFunc("POST "+PathPrefix+"caches", h.reserve)
	mux.HandleFunc("PATCH "+PathPrefix+"caches/{id}", h.upload)
	mux.HandleFunc("POST "+PathPrefix+"caches/{id}", h.commit)
	mux.HandleFunc("GET "+PathPrefix+"artifacts/{id}", h.download)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, ok := r.Context().Value(scopeKey{}).(Scope)
		if !ok || s.check() != nil {
			writeError(w, http.StatusUnauthorized, errors.New("no authenticated scope"))
			return
		}
		mux.ServeHTTP(w, r)
	})
}

type handler struct {
	c   *Cache
	log *slog.Logger
}

func scopeOf(r *http.Request) Scope {
	s, _ := r.Context().Value(scopeKey{}).(Scope)
	return s
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, map[string]string{"message": err.Error()})
}

// fail answers err with its status: the protocol's, as @actions/cache reads
// them (400 at reservation is "over the size limit", 409 "being created").
func (h handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusInternalServerError
	var mbe *http.MaxBytesError
	switch {
	case errors.Is(err, ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, ErrExists):
		status = http.StatusConflict
	case errors.Is(err, ErrTooLarge) && r.Method == http.MethodPost:
		status = http.StatusBadRequest
	case errors.Is(err, ErrTooLarge), errors.As(err, &mbe):
		status = http.StatusRequestEntityTooLarge
	case errors.Is(err, ErrInvalid):
		status = http.StatusBadRequest
	}
	if status == http.StatusInternalServerError {
		h.log.Error("cache request failed", slog.String("repository", scopeOf(r).Repository), slog.Any("error", err))
		err = errors.New("the cache failed")
	}
	writeError(w, status, err)
}

func (h handler) lookup(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	keys := strings.Split(q.Get("keys"), ",")
	if len(keys) > maxKeys {
		h.fail(w, r, fmt.Errorf("%w: more than %d keys", ErrInvalid, maxKeys))
		return
	}
	base, err := archiveBase(r.Header.Get(HeaderBase))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	e, err := h.c.Lookup(r.Context(), scopeOf(r), keys, q.Get("version"))
	if errors.Is(err, ErrNotFound) {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"result": "hit", "cacheKey": e.Key, "cacheVersion": e.Version, "scope": e.Ref,
		"creationTime":    e.Created,
		"archiveLocation": base + strings.TrimPrefix(PathPrefix, "/") + "artifacts/" + strconv.FormatInt(e.ID, 10),
	})
}

// archiveBase checks the base URL the proxy sent: http, a loopback IP and a
// port, ending in "/".
func archiveBase(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" || u.User != nil || u.RawQuery != "" || !strings.HasSuffix(u.Path, "/") {
		return "", fmt.Errorf("%w: %s is not an http URL ending in /", ErrInvalid, HeaderBase)
	}
	ip := net.ParseIP(u.Hostname())
	if ip == nil || !ip.IsLoopback() || u.Port() == "" {
		return "", fmt.Errorf("%w: %s is not a loopback address", ErrInvalid, HeaderBase)
	}
	return u.String(), nil
}

// list answers the diagnostic listing @actions/cache asks for in debug mode
// after a miss: nothing is listed.
func (h handler) list(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"totalCount": 0, "artifactCaches": []any{}})
}

func decode(w http.ResponseWriter, r *http.Request, v any) error {
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxJSONBytes)).Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		return fmt.Errorf("%w: body: %v", ErrInvalid, err)
	}
	return nil
}

func (h handler) reserve(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Key       string `json:"key"`
		Version   string `json:"version"`
		CacheSize int64  `json:"cacheSize"`
	}
	if err := decode(w, r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	id, err := h.c.Reserve(r.Context(), scopeOf(r), req.Key, req.Version, req.CacheSize)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"cacheId": id})
}

func pathID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("%w: cache ID %q", ErrNotFound, r.PathValue("id"))
	}
	return id, nil
}

var contentRange = regexp.MustCompile(`^bytes (\d{1,15})-(\d{1,15})/(\*|\d{1,15})$`)

func (h handler) upload(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	m := contentRange.FindStringSubmatch(r.Header.Get("Content-Range"))
	if m == nil {
		h.fail(w, r, fmt.Errorf("%w: Content-Range %q", ErrInvalid, r.Header.Get("Content-Range")))
		return
	}
	start, _ := strconv.ParseInt(m[1], 10, 64)
	end, _ := strconv.ParseInt(m[2], 10, 64)
	if n := end - start + 1; n > MaxChunkBytes || (r.ContentLength >= 0 && r.ContentLength != n) {
		h.fail(w, r, fmt.Errorf("%w: a chunk of %d bytes (at most %d, Content-Length %d)", ErrTooLarge, n, MaxChunkBytes, r.ContentLength))
		return
	}
	body := http.MaxBytesReader(w, r.Body, MaxChunkBytes)
	if err := h.c.Upload(r.Context(), scopeOf(r), id, start, end, body); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h handler) commit(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var req struct {
		Size int64 `json:"size"`
	}
	if err := decode(w, r, &req); err != nil {
		h.fail(w, r, err)
		return
	}
	if err := h.c.Commit(r.Context(), scopeOf(r), id, req.Size); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h handler) download(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	f, e, err := h.c.Open(r.Context(), scopeOf(r), id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", e.Created, f)
}
