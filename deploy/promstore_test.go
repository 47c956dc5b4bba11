package deploy

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"
)

// promStore is the tests' Prometheus storage: float samples in memory, read by Prometheus' own
// engine through Prometheus' storage interfaces (storage.Queryable, storage.MockQuerier,
// promql.NewStorageSeries). It stands in for Prometheus' TSDB (util/teststorage), whose
// package imports Prometheus' configuration and with it service discovery and the AWS, Azure
// and Google Cloud SDKs; what the queries see is the same: staleness markers are samples
// (value.StaleNaN) the engine reads as Prometheus' TSDB hands them over.
//
// Invariants, those of a TSDB head: a series' samples are in strictly increasing time order
// (add refuses an older timestamp, and another value at the same one); a series has no label
// name twice; a querier returns the series in label order with only the samples of its time
// range.
type promStore struct {
	series map[string]*promql.Series // by labels.Labels.String
}

func newPromStore() *promStore {
	return &promStore{series: map[string]*promql.Series{}}
}

// add stores v at t (milliseconds) in the series l, as a TSDB appender does: a sample older
// than its series' last is storage.ErrOutOfOrderSample, another value at the last one's time
// storage.ErrDuplicateSampleForTimestamp, the same value there is dropped.
func (s *promStore) add(l labels.Labels, t int64, v float64) error {
	if name, dup := l.HasDuplicateLabelNames(); dup {
		return fmt.Errorf("series %s: label name %q twice", l, name)
	}
	k := l.String()
	ser, ok := s.series[k]
	if !ok {
		ser = &promql.Series{Metric: l}
		s.series[k] = ser
	}
	if n := len(ser.Floats); n > 0 {
		last := ser.Floats[n-1]
		switch {
		case t < last.T:
			return fmt.Errorf("series %s at %d: %w", l, t, storage.ErrOutOfOrderSample)
		case t == last.T && math.Float64bits(v) == math.Float64bits(last.F):
			return nil
		case t == last.T:
			return fmt.Errorf("series %s at %d: %w", l, t, storage.ErrDuplicateSampleForTimestamp)
		}
	}
	ser.Floats = append(ser.Floats, promql.FPoint{T: t, F: v})
	return nil
}

// Querier serves the samples from mint to maxt (milliseconds, both included) of the series
// that match a Select's matchers.
func (s *promStore) Querier(mint, maxt int64) (storage.Querier, error) {
	return &storage.MockQuerier{SelectMockFunction: func(_ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
		return s.selectSeries(mint, maxt, ms)
	}}, nil
}

func (s *promStore) selectSeries(mint, maxt int64, ms []*labels.Matcher) storage.SeriesSet {
	var out []storage.Series
	for _, ser := range s.series {
		if !slices.ContainsFunc(ms, func(m *labels.Matcher) bool { return !m.Matches(ser.Metric.Get(m.Name)) }) {
			from, _ := slices.BinarySearchFunc(ser.Floats, mint, func(p promql.FPoint, t int64) int { return cmp.Compare(p.T, t) })
			to, found := slices.BinarySearchFunc(ser.Floats, maxt, func(p promql.FPoint, t int64) int { return cmp.Compare(p.T, t) })
			if found {
				to++
			}
			if from < to {
				out = append(out, promql.NewStorageSeries(promql.Series{Metric: ser.Metric, Floats: ser.Floats[from:to]}))
			}
		}
	}
	slices.SortFunc(out, func(a, b storage.Series) int { return labels.Compare(a.Labels(), b.Labels()) })
	return &seriesList{rest: out}
}

// seriesList is a storage.SeriesSet over series in memory.
type seriesList struct {
	rest []storage.Series // the series after cur
	cur  storage.Series   // At's; nil before the first Next
}

func (l *seriesList) Next() bool {
	if len(l.rest) == 0 {
		return false
	}
	l.cur, l.rest = l.rest[0], l.rest[1:]
	return true
}

func (l *seriesList) At() storage.Series              { return l.cur }
func (*seriesList) Err() error                        { return nil }
func (*seriesList) Warnings() annotations.Annotations { return nil }
