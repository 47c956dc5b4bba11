package runner

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"slices"

	"github.com/sirupsen/logrus"
)

// logrusInto makes l (act's and the reporter's logrus logger) write its
// entries through h, the runner's slog handler, and nothing of its own: the
// runner's log is one format, every line from the runner, act or the
// reporter alike.
func logrusInto(l *logrus.Logger, h slog.Handler) {
	l.SetOutput(io.Discard)
	l.ReplaceHooks(logrus.LevelHooks{})
	l.AddHook(slogHook{h})
}

// slogHook is a logrus.Hook that hands each entry to a slog.Handler: its
// time, level, message and fields (sorted by name), an error field as the
// error.
type slogHook struct{ h slog.Handler }

func (slogHook) Levels() []logrus.Level { return logrus.AllLevels }

func (s slogHook) Fire(e *logrus.Entry) error {
	ctx := e.Context
	if ctx == nil {
		ctx = context.Background()
	}
	level := slogLevel(e.Level)
	if !s.h.Enabled(ctx, level) {
		return nil
	}
	r := slog.NewRecord(e.Time, level, e.Message, 0)
	for _, k := range slices.Sorted(maps.Keys(e.Data)) {
		r.AddAttrs(slog.Any(k, e.Data[k]))
	}
	return s.h.Handle(ctx, r)
}

// slogLevel maps a logrus level to slog's: trace is debug, fatal and panic
// are errors (the hook only writes; logrus itself exits or panics).
func slogLevel(l logrus.Level) slog.Level {
	switch l {
	case logrus.TraceLevel, logrus.DebugLevel:
		return slog.LevelDebug
	case logrus.InfoLevel:
		return slog.LevelInfo
	case logrus.WarnLevel:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}
