package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/gitea"
)

// TestOutage feeds the outage tracker failures and successes and checks the
// lines it writes: one warning per new cause, one info line when Gitea
// answers again, debug in between.
func TestOutage(t *testing.T) {
	down := fmt.Errorf("dispatch: %w", &gitea.Error{Op: "FetchTask", Code: connect.CodeUnavailable, Message: "connection refused"})
	refused := fmt.Errorf("dispatch: %w", &gitea.Error{Op: "FetchTask", Code: connect.CodeInternal, Message: "boom"})
	type step struct {
		do   string // "round" (a failed dispatch round, or answered with a nil err), "recover"
		err  error
		want string // level and message of the line written, "" for none
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"an outage and its end", []step{
			{"round", nil, ""},
			{"round", down, "WARN Gitea unreachable; retrying less and less often, at most every 30s"},
			{"round", down, "DEBUG Gitea unreachable, again"},
			{"recover", down, "DEBUG Gitea unreachable, again"},
			{"round", down, "DEBUG Gitea unreachable, again"},
			{"round", nil, "INFO Gitea answers again"},
			{"round", nil, ""},
		}},
		{"recover notices first", []step{
			{"recover", down, "WARN Gitea unreachable; retrying less and less often, at most every 30s"},
			{"round", down, "DEBUG Gitea unreachable, again"},
			{"round", nil, "INFO Gitea answers again"},
		}},
		{"another cause, then unreachable", []step{
			{"round", refused, "WARN dispatch round failed; retrying less and less often, at most every 30s"},
			{"round", refused, "DEBUG dispatch round failed, again"},
			{"round", down, "WARN Gitea unreachable; retrying less and less often, at most every 30s"},
			{"round", nil, "INFO Gitea answers again"},
		}},
		{"recover's other failures are its own to say", []step{
			{"recover", refused, ""},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			log := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey {
					return slog.Attr{}
				}
				return a
			}}))
			now := time.Unix(1_700_000_000, 0)
			o := &outage{log: log, url: "http://gitea.test/", now: func() time.Time { return now }}
			ctx := context.Background()
			for i, s := range tt.steps {
				out.Reset()
				now = now.Add(10 * time.Second)
				switch {
				case s.do == "recover":
					if got := o.unreachableOnly(ctx, "recover pass", s.err); got != unreachable(s.err) {
						t.Fatalf("step %d: unreachableOnly = %v", i, got)
					}
				case s.err == nil:
					o.answered(ctx)
				default:
					o.failed(ctx, "dispatch round", s.err)
				}
				line := slogText(out.String())
				if got := line["level"] + " " + line["msg"]; (s.want == "" && out.Len() != 0) || (s.want != "" && got != s.want) {
					t.Fatalf("step %d: wrote %q, want %q", i, out.String(), s.want)
				}
				if s.want != "" && line["level"] != "DEBUG" && line["gitea"] != "http://gitea.test/" {
					t.Errorf("step %d: %q does not name Gitea", i, out.String())
				}
			}
		})
	}
}

// The cores' info lines are local mode's debug lines; their warnings stay
// warnings.
func TestInternalsDemoteInfo(t *testing.T) {
	for _, tc := range []struct {
		level     slog.Level // the handler's
		logged    slog.Level // the line's
		wantLevel string     // "" for not written
	}{
		{slog.LevelInfo, slog.LevelInfo, ""},
		{slog.LevelInfo, slog.LevelDebug, ""},
		{slog.LevelDebug, slog.LevelInfo, "DEBUG"},
		{slog.LevelDebug, slog.LevelWarn, "WARN"},
		{slog.LevelInfo, slog.LevelWarn, "WARN"},
		{slog.LevelInfo, slog.LevelError, "ERROR"},
	} {
		var out bytes.Buffer
		log := slog.New(internals{slog.NewTextHandler(&out, &slog.HandlerOptions{Level: tc.level})}).With(slog.String("pool", "local"))
		log.Log(context.Background(), tc.logged, "assignment accepted")
		line := slogText(out.String())
		if line["level"] != tc.wantLevel || (tc.wantLevel != "" && line["pool"] != "local") {
			t.Errorf("at level %v, a %v line wrote %q, want level %q", tc.level, tc.logged, out.String(), tc.wantLevel)
		}
	}
}

// slogText reads the key=value pairs of one line of slog's TextHandler.
func slogText(line string) map[string]string {
	out := map[string]string{}
	for rest := strings.TrimSpace(line); rest != ""; {
		key, after, ok := strings.Cut(rest, "=")
		if !ok {
			break
		}
		var val string
		if strings.HasPrefix(after, `"`) {
			if v, err := strconv.QuotedPrefix(after); err == nil {
				val, _ = strconv.Unquote(v)
				after = after[len(v):]
			}
		} else {
			val, after, _ = strings.Cut(after, " ")
		}
		out[key] = val
		rest = strings.TrimSpace(after)
	}
	return out
}
