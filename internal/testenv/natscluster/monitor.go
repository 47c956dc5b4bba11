package natscluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// account is the account every stream is in: the default one (no
// authentication).
const account = "$G"

// ErrNoReplica is returned (wrapped) by Replica when the server holds no copy
// of the stream.
var ErrNoReplica = errors.New("no replica")

// monitor reads the servers' HTTP monitoring endpoints. A paused server
// accepts the connection and answers nothing: its requests end with the
// client's timeout.
type monitor struct{ http *http.Client }

func newMonitor() monitor { return monitor{http: &http.Client{Timeout: 2 * time.Second}} }

// get GETs path from s's monitoring port and decodes the JSON answer into v.
// An answer other than 200 is an error holding its body.
func (m monitor) get(ctx context.Context, s *server, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(s.monitor)+path, nil)
	if err != nil {
		return err
	}
	resp, err := m.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("%s: GET %s: %w", s.name, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: GET %s: %s: %s", s.name, path, resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("%s: GET %s: %w", s.name, path, err)
	}
	return nil
}

// healthz is nil once s's /healthz answers ok: it accepts clients, JetStream
// is on, it knows the meta leader and its streams and consumers are current.
func (m monitor) healthz(ctx context.Context, s *server) error {
	var h struct {
		Status string `json:"status"`
	}
	if err := m.get(ctx, s, "/healthz", &h); err != nil {
		return err
	}
	if h.Status != "ok" {
		return fmt.Errorf("%s: /healthz: status %q", s.name, h.Status)
	}
	return nil
}

// jsz is the part of nats-server's /jsz answer read here.
type jsz struct {
	Meta     *clusterInfo `json:"meta_cluster"`
	Accounts []struct {
		Name    string   `json:"name"`
		Streams []stream `json:"stream_detail"`
	} `json:"account_details"`
}

// stream is one stream of /jsz?streams=true&config=true: the answering
// server's copy.
type stream struct {
	Name    string       `json:"name"`
	Cluster *clusterInfo `json:"cluster"`
	Config  *struct {
		Replicas int `json:"num_replicas"`
	} `json:"config"`
	State struct {
		Msgs     uint64 `json:"messages"`
		FirstSeq uint64 `json:"first_seq"`
		LastSeq  uint64 `json:"last_seq"`
	} `json:"state"`
}

// clusterInfo is a Raft group as one member sees it. Replicas are the other
// members; only the leader knows whether they are current.
type clusterInfo struct {
	Leader   string `json:"leader"`
	Replicas []struct {
		Name    string `json:"name"`
		Current bool   `json:"current"`
		Offline bool   `json:"offline"`
		Lag     uint64 `json:"lag"`
	} `json:"replicas"`
}

// stream returns the answering server's copy of name in the default
// account, or nil.
func (j *jsz) stream(name string) *stream {
	for _, a := range j.Accounts {
		if a.Name != account {
			continue
		}
		for k := range a.Streams {
			if a.Streams[k].Name == name {
				return &a.Streams[k]
			}
		}
	}
	return nil
}

// metaLeader is the meta leader j names, or "".
func metaLeader(j *jsz) string {
	if j.Meta == nil {
		return ""
	}
	return j.Meta.Leader
}

// streamsQuery is the /jsz query with every stream's cluster, configuration
// and state.
const streamsQuery = "/jsz?streams=true&config=true"

// leader returns the index of the one live server whose /jsz (at query)
// names itself leader, by named, and that answer. No such server, or more
// than one (a deposed leader not yet told), is ErrNoLeader.
func (c *Cluster) leader(ctx context.Context, what, query string, named func(*jsz) string) (int, *jsz, error) {
	var claims []int
	var seen []string
	var view *jsz
	for _, i := range c.live() {
		s := c.servers[i]
		var j jsz
		if err := c.mon.get(ctx, s, query, &j); err != nil {
			seen = append(seen, err.Error())
			continue
		}
		l := named(&j)
		seen = append(seen, fmt.Sprintf("%s names %q", s.name, l))
		if l == s.name {
			claims = append(claims, i)
			view = &j
		}
	}
	if len(claims) == 1 {
		return claims[0], view, nil
	}
	return -1, nil, fmt.Errorf("%s: %w (%s)", what, ErrNoLeader, strings.Join(seen, "; "))
}

// MetaLeader returns the index of the JetStream meta leader: the one running,
// unpaused server that names itself meta leader in its /jsz. It does not wait
// (see WaitMetaLeader).
func (c *Cluster) MetaLeader(ctx context.Context) (int, error) {
	i, _, err := c.leader(ctx, "meta", "/jsz", metaLeader)
	return i, wrap(err)
}

// wrap prefixes err, if any, with the package's name.
func wrap(err error) error {
	if err != nil {
		return fmt.Errorf("natscluster: %w", err)
	}
	return nil
}

// StreamLeader returns the index of stream's leader (default account): the
// one running, unpaused server whose copy of the stream names itself leader
// in its /jsz. It does not wait (see WaitStreamLeader).
func (c *Cluster) StreamLeader(ctx context.Context, stream string) (int, error) {
	i, _, err := c.streamLeader(ctx, stream)
	return i, wrap(err)
}

func (c *Cluster) streamLeader(ctx context.Context, name string) (int, *jsz, error) {
	return c.leader(ctx, "stream "+name, streamsQuery, func(j *jsz) string {
		if st := j.stream(name); st != nil && st.Cluster != nil {
			return st.Cluster.Leader
		}
		return ""
	})
}

// WaitMetaLeader waits until there is a meta leader (MetaLeader) that sees
// every other running, unpaused server current, and returns its index.
//
// The second condition matters after a leader is killed or stopped: a meta
// leader counts a follower caught up only once it has acked since the
// election, and until then places a new stream's replicas on followers at
// random, the dead server included (nats-server marks a SIGKILLed server
// offline only after minutes), where the stream never gets a leader.
// Past WaitMetaLeader, placement prefers the live servers.
func (c *Cluster) WaitMetaLeader(ctx context.Context) (int, error) {
	leader := -1
	err := c.poll(ctx, func(ctx context.Context) error {
		i, view, err := c.leader(ctx, "meta", "/jsz", metaLeader)
		if err != nil {
			return err
		}
		for _, j := range c.live() {
			if j != i {
				if err := c.sees("meta", view.Meta, j); err != nil {
					return err
				}
			}
		}
		leader = i
		return nil
	})
	return leader, wrap(err)
}

// WaitStreamLeader waits until stream has a leader (StreamLeader) and
// returns its index.
func (c *Cluster) WaitStreamLeader(ctx context.Context, stream string) (int, error) {
	leader := -1
	err := c.poll(ctx, func(ctx context.Context) (err error) {
		leader, _, err = c.streamLeader(ctx, stream)
		return err
	})
	return leader, wrap(err)
}

// WaitStreamCurrent waits until stream has a leader and all its other
// replicas (num_replicas - 1 of them) are running, not paused, and online and
// current as the leader sees it: each has everything the leader has
// committed. It returns the leader's index.
func (c *Cluster) WaitStreamCurrent(ctx context.Context, stream string) (int, error) {
	leader := -1
	err := c.poll(ctx, func(ctx context.Context) error {
		i, view, err := c.streamLeader(ctx, stream)
		if err != nil {
			return err
		}
		st := view.stream(stream)
		if st.Config == nil {
			return fmt.Errorf("stream %s: %s's /jsz has no configuration", stream, c.servers[i].name)
		}
		if err := c.allCurrent("stream "+stream, st.Cluster, st.Config.Replicas-1); err != nil {
			return err
		}
		leader = i
		return nil
	})
	return leader, wrap(err)
}

// allCurrent is nil if ci, a leader's view, lists want other members, each
// a server running and not paused that the leader sees online and current.
//
// Running matters: a leader counts a member current until it has not heard
// from it for 10 s (nats-server's lostQuorumInterval), so its view alone
// cannot tell a member killed a moment ago from a current one.
func (c *Cluster) allCurrent(what string, ci *clusterInfo, want int) error {
	if len(ci.Replicas) != want {
		return fmt.Errorf("%s: leader %s lists %d other replicas, want %d", what, ci.Leader, len(ci.Replicas), want)
	}
	live := c.live()
	for _, r := range ci.Replicas {
		if i := c.Index(r.Name); !slices.Contains(live, i) {
			return fmt.Errorf("%s: replica %s is not running, or paused", what, r.Name)
		}
		if !r.Current || r.Offline {
			return fmt.Errorf("%s: leader %s sees %s current=%t offline=%t lag=%d", what, ci.Leader, r.Name, r.Current, r.Offline, r.Lag)
		}
	}
	return nil
}

// sees is nil if ci, a leader's view, lists server i online and current.
func (c *Cluster) sees(what string, ci *clusterInfo, i int) error {
	name := c.servers[i].name
	for _, r := range ci.Replicas {
		if r.Name == name {
			if !r.Current || r.Offline {
				return fmt.Errorf("%s: leader %s sees %s current=%t offline=%t lag=%d", what, ci.Leader, name, r.Current, r.Offline, r.Lag)
			}
			return nil
		}
	}
	return fmt.Errorf("%s: leader %s does not list %s", what, ci.Leader, name)
}

// WaitHealthy waits until every server is running (not paused), answers ok
// on /healthz, and the meta leader sees all the others online and current.
// It fails at once if a server is down or paused.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	return wrap(c.healthy(ctx))
}

func (c *Cluster) healthy(ctx context.Context) error {
	if live := c.live(); len(live) != len(c.servers) {
		return fmt.Errorf("%d of %d servers running and not paused", len(live), len(c.servers))
	}
	return c.poll(ctx, func(ctx context.Context) error {
		for _, s := range c.servers {
			if err := c.mon.healthz(ctx, s); err != nil {
				return err
			}
		}
		_, view, err := c.leader(ctx, "meta", "/jsz", metaLeader)
		if err != nil {
			return err
		}
		return c.allCurrent("meta", view.Meta, len(c.servers)-1)
	})
}

// metaCurrent is nil if there is a meta leader and it is server i or sees
// server i online and current.
func (c *Cluster) metaCurrent(ctx context.Context, i int) error {
	leader, view, err := c.leader(ctx, "meta", "/jsz", metaLeader)
	if err != nil {
		return err
	}
	if leader == i {
		return nil
	}
	return c.sees("meta", view.Meta, i)
}

// ReplicaState is one server's copy of a stream, as its /jsz shows it.
type ReplicaState struct {
	// Messages is how many messages the copy holds.
	Messages uint64
	// FirstSeq and LastSeq are the sequences of its first and last message.
	FirstSeq, LastSeq uint64
	// Leader is the server the copy names the stream's leader ("" for none).
	Leader string
}

// Replica returns server i's own copy of stream (default account), read from
// its /jsz: what it has stored, whether or not it is the leader or current.
// A server holding no copy is ErrNoReplica. Server i must be running and not
// paused (a paused one answers nothing).
func (c *Cluster) Replica(ctx context.Context, i int, stream string) (ReplicaState, error) {
	s := c.servers[i]
	var j jsz
	if err := c.mon.get(ctx, s, streamsQuery, &j); err != nil {
		return ReplicaState{}, fmt.Errorf("natscluster: %w", err)
	}
	st := j.stream(stream)
	if st == nil {
		return ReplicaState{}, fmt.Errorf("natscluster: %s: stream %s: %w", s.name, stream, ErrNoReplica)
	}
	r := ReplicaState{Messages: st.State.Msgs, FirstSeq: st.State.FirstSeq, LastSeq: st.State.LastSeq}
	if st.Cluster != nil {
		r.Leader = st.Cluster.Leader
	}
	return r, nil
}
