package runner

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
)

// What act and the reporter log through logrus comes out as the runner's
// own JSON lines: level, message, fields and error, with the runner's
// attributes; nothing in logrus' text format; below the runner's level,
// nothing.
func TestLogrusInTheRunnersFormat(t *testing.T) {
	var out bytes.Buffer
	log := program.Logger(&out, slog.LevelInfo).With(slog.Int64("task", 7))
	l := logrus.New() // act's standard logger, in the runner
	logrusInto(l, log.Handler())
	l.SetLevel(logrus.TraceLevel)
	l.WithField("step", "checkout").WithError(errors.New("connection reset")).Warn("flush failed; will retry")
	l.Error("Cannot connect to the Docker daemon")
	l.Debug("below the runner's level")
	l.Trace("below it too")
	var got []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("a line is not the runner's JSON: %q", line)
		}
		got = append(got, m)
	}
	want := []map[string]any{
		{"level": "WARN", "msg": "flush failed; will retry", "step": "checkout", "error": "connection reset", "task": 7.0, "function": "runner"},
		{"level": "ERROR", "msg": "Cannot connect to the Docker daemon", "task": 7.0},
	}
	if len(got) != len(want) {
		t.Fatalf("lines:\n%s\nwant %d", out.String(), len(want))
	}
	for i, w := range want {
		for k, v := range w {
			if got[i][k] != v {
				t.Errorf("line %d: %s = %v, want %v", i, k, got[i][k], v)
			}
		}
	}
}

func TestSlogLevel(t *testing.T) {
	for l, want := range map[logrus.Level]slog.Level{
		logrus.TraceLevel: slog.LevelDebug, logrus.DebugLevel: slog.LevelDebug, logrus.InfoLevel: slog.LevelInfo,
		logrus.WarnLevel: slog.LevelWarn, logrus.ErrorLevel: slog.LevelError, logrus.FatalLevel: slog.LevelError, logrus.PanicLevel: slog.LevelError,
	} {
		if got := slogLevel(l); got != want {
			t.Errorf("slogLevel(%v) = %v, want %v", l, got, want)
		}
	}
}
