package reporter

import (
	"cmp"
	"slices"
	"strings"
)

// maskText replaces every secret in text.
const maskText = "***"

// masker hides secret values. Its zero value masks nothing. It is not safe
// for concurrent use: the Reporter guards it with its mutex.
//
// Unlike a longest-first strings.Replacer, which replaces the first match at
// each position and so can leave the tail of a longer secret that starts
// inside a shorter one, masker replaces the union of every occurrence of
// every value: no byte of any value survives, whatever the overlaps.
type masker struct {
	values []string            // longest first
	known  map[string]struct{} // the set of values
}

// add registers v and its variants: v itself, v without surrounding white
// space and, for a multi-line v, each of its lines (without white space).
// Empty and white-space-only variants are skipped. It reports whether any
// variant was new.
func (m *masker) add(v string) bool {
	added := m.addOne(v)
	if t := strings.TrimSpace(v); t != v {
		added = m.addOne(t) || added
	}
	if strings.ContainsAny(v, "\r\n") {
		for _, line := range strings.FieldsFunc(v, func(r rune) bool { return r == '\n' || r == '\r' }) {
			added = m.addOne(strings.TrimSpace(line)) || added
		}
	}
	return added
}

func (m *masker) addOne(v string) bool {
	if strings.TrimSpace(v) == "" {
		return false
	}
	if _, ok := m.known[v]; ok {
		return false
	}
	if m.known == nil {
		m.known = map[string]struct{}{}
	}
	m.known[v] = struct{}{}
	m.values = append(m.values, v)
	slices.SortStableFunc(m.values, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	return true
}

// mask returns s with every occurrence of every value, and every overlap
// of occurrences, replaced by a single "***".
func (m *masker) mask(s string) string {
	if len(m.values) == 0 || s == "" {
		return s
	}
	type span struct{ start, end int }
	var spans []span
	for _, v := range m.values {
		for i := 0; i+len(v) <= len(s); {
			j := strings.Index(s[i:], v)
			if j < 0 {
				break
			}
			spans = append(spans, span{i + j, i + j + len(v)})
			i += j + 1
		}
	}
	if len(spans) == 0 {
		return s
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.start, b.start) })
	var b strings.Builder
	b.Grow(len(s))
	pos := 0
	for k := 0; k < len(spans); {
		start, end := spans[k].start, spans[k].end
		for k++; k < len(spans) && spans[k].start <= end; k++ {
			end = max(end, spans[k].end)
		}
		b.WriteString(s[pos:start])
		b.WriteString(maskText)
		pos = end
	}
	b.WriteString(s[pos:])
	return b.String()
}
