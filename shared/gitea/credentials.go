package gitea

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runnerpool"
)

// Token is a runner token. It never prints: fmt and slog show a placeholder;
// only JSON (the credentials file) holds its value.
type Token string

func (Token) String() string { return "[redacted]" }

// GoString keeps %#v from printing the value.
func (Token) GoString() string { return "[redacted]" }

// LogValue keeps the token out of structured logs.
func (Token) LogValue() slog.Value { return slog.StringValue("[redacted]") }

// Credentials identify one registered runner. UUID and Token authenticate
// every call but Register.
type Credentials struct {
	ID    int64  `json:"id"`
	UUID  string `json:"uuid"`
	Token Token  `json:"token"`
	Name  string `json:"name"`
}

// EncodeCredentials is a credentials file's content (FileStore's; a Secret's key holds the same
// and is mounted as the file).
func EncodeCredentials(c Credentials) ([]byte, error) {
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// ErrNoCredentials means the pool has not been registered yet.
var ErrNoCredentials = errors.New("runner credentials not found")

// FileStore keeps a registration's credentials in one JSON file, readable by
// its owner only.
type FileStore struct{ Path string }

// Load reads the credentials; a missing file wraps ErrNoCredentials.
func (s FileStore) Load() (Credentials, error) {
	data, err := os.ReadFile(s.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return Credentials{}, fmt.Errorf("%s: %w", s.Path, ErrNoCredentials)
	}
	if err != nil {
		return Credentials{}, err
	}
	var c Credentials
	if err := json.Unmarshal(data, &c); err != nil {
		return Credentials{}, fmt.Errorf("credentials file %s is not valid JSON", s.Path)
	}
	if c.UUID == "" || c.Token == "" {
		return Credentials{}, fmt.Errorf("credentials file %s has no uuid or token", s.Path)
	}
	return c, nil
}

// Save writes the credentials atomically (a crash leaves the old file or the
// new one, never half of one), with mode 0600.
func (s FileStore) Save(c Credentials) error {
	data, err := EncodeCredentials(c)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(s.Path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(s.Path), ".credentials-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), s.Path)
}

// PoolClients returns a client per pool, from each pool's credentials file. A
// pool without credentials is an error telling to run `dispatch register`.
func PoolClients(rootURL string, hc *http.Client, pools runnerpool.Pools) (map[string]*Client, error) {
	clients := make(map[string]*Client, len(pools))
	for _, p := range pools {
		creds, err := FileStore{Path: p.Credentials}.Load()
		if errors.Is(err, ErrNoCredentials) {
			return nil, fmt.Errorf("pool %s is not registered: run `dispatch register` (%w)", p.Name, err)
		}
		if err != nil {
			return nil, fmt.Errorf("pool %s: %w", p.Name, err)
		}
		c, err := NewClient(rootURL, hc, creds)
		if err != nil {
			return nil, fmt.Errorf("pool %s: %w", p.Name, err)
		}
		clients[p.Name] = c
	}
	return clients, nil
}

// InstanceSettings is embedded in the configuration of every function that talks to
// Gitea.
type InstanceSettings struct {
	GiteaURL string `envconfig:"GDR_GITEA_URL" required:"true" desc:"Gitea's root URL, e.g. https://gitea.example.com/"`
}
