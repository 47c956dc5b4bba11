// Package envdoc describes a function's environment variables from its
// envconfig specification: for the -help output (Usage), and for the tables
// of docs/CONFIGURATION.md, which are generated (Table) into sections of that
// file marked per function and kept current by each function's test (Sync).
package envdoc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/template"

	"github.com/kelseyhightower/envconfig"
)

// Var is one environment variable of a specification.
type Var struct {
	Name     string
	Default  string
	Required bool
	Desc     string
}

var listing = template.Must(template.New("vars").Parse(
	"{{range .}}{{.Key}}\t{{.Alt}}\t{{.Name}}\t{{.Tags.Get \"default\"}}\t{{.Tags.Get \"required\"}}\t{{.Tags.Get \"desc\"}}\n{{end}}"))

// Every field of a specification names its variable in full in its envconfig
// tag (`envconfig:"GDR_MODE"`), and specifications are read with an empty
// prefix. envconfig reads a tagged field from "<prefix>_<tag>" and, when that
// is unset, from the bare tag as well: with a prefix, a MODE or CAPACITY
// already in a container's environment would be taken silently. With the
// full name as the tag and no prefix, both lookups are of the same name, and
// nothing else is read. Vars refuses a field without a tag, which envconfig
// would read from its bare field name.

// Vars lists the variables of spec (a pointer to an envconfig struct), as
// envconfig itself resolves their names. A field without an envconfig tag
// is an error naming it.
func Vars(spec any) ([]Var, error) {
	var out bytes.Buffer
	if err := envconfig.Usaget("", spec, &out, listing); err != nil {
		return nil, err
	}
	var vars []Var
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), "\t", 6)
		if len(f) != 6 {
			continue
		}
		if f[1] == "" {
			return nil, fmt.Errorf("field %s has no envconfig tag naming its variable", f[2])
		}
		vars = append(vars, Var{Name: f[0], Default: f[3], Required: f[4] == "true", Desc: f[5]})
	}
	return vars, sc.Err()
}

// Process fills spec from the environment with envconfig.Process, each
// field from the one variable its tag names. A missing required variable is
// reported by name, all of them at once, before any value that does not
// parse. Only when envconfig.Process fails are the variables listed (Vars
// renders a template over every field: a cost every start would pay
// otherwise); on error spec may be partly filled.
func Process(spec any) error {
	perr := envconfig.Process("", spec)
	if perr == nil {
		return nil
	}
	vars, err := Vars(spec)
	if err != nil {
		return err
	}
	var missing []string
	for _, v := range vars {
		if _, ok := os.LookupEnv(v.Name); v.Required && !ok {
			missing = append(missing, v.Name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("required variables not set: %s", strings.Join(missing, ", "))
	}
	return redact(perr)
}

// redact rewrites envconfig's parse error, which quotes the value (a key, a
// secret), into one that names the variable and the cause only.
func redact(err error) error {
	var pe *envconfig.ParseError
	if !errors.As(err, &pe) {
		return err
	}
	cause := "not a valid " + pe.TypeName
	var ne *strconv.NumError
	switch {
	case errors.As(pe.Err, &ne):
		cause += ": " + ne.Err.Error()
	case pe.Err != nil && pe.Value != "" && !strings.Contains(pe.Err.Error(), pe.Value):
		cause += ": " + pe.Err.Error()
	}
	return fmt.Errorf("%s: %s", pe.KeyName, cause)
}

// Usage writes a plain table of the variables of spec.
func Usage(w io.Writer, spec any) error {
	vars, err := Vars(spec)
	if err != nil {
		return err
	}
	for _, v := range vars {
		def := v.Default
		if v.Required {
			def = "(required)"
		}
		if _, err := fmt.Fprintf(w, "  %-28s %-24s %s\n", v.Name, def, v.Desc); err != nil {
			return err
		}
	}
	return nil
}

// row is how docs/CONFIGURATION.md documents v:
// "| `NAME` | default | description |", where default is the value in
// backticks, "required", or empty.
func row(v Var) string {
	def := ""
	switch {
	case v.Required:
		def = "required"
	case v.Default != "":
		def = "`" + v.Default + "`"
	}
	return fmt.Sprintf("| `%s` | %s | %s |", v.Name, def, v.Desc)
}

// table renders vars as a Markdown table: a header, then one row per
// variable in their order, every line ending in a newline.
func table(vars []Var) string {
	var b strings.Builder
	b.WriteString("| Variable | Default | What it does |\n|---|---|---|\n")
	for _, v := range vars {
		b.WriteString(row(v) + "\n")
	}
	return b.String()
}

// markers returns the two lines that enclose the generated section name of
// a Markdown file, HTML comments that Markdown does not show:
//
//	<!-- envdoc:begin NAME -->
//	<!-- envdoc:end NAME -->
func markers(name string) (begin, end string) {
	return "<!-- envdoc:begin " + name + " -->", "<!-- envdoc:end " + name + " -->"
}

// section returns the text of doc's section name: the lines between its
// two markers, each of which must stand once on a line of its own.
func section(doc []byte, name string) (string, error) {
	start, stop, err := bounds(doc, name)
	if err != nil {
		return "", err
	}
	return string(doc[start:stop]), nil
}

// replaceSection returns doc with the text of its section name replaced by
// body (which ends in a newline), every other byte as it was.
func replaceSection(doc []byte, name, body string) ([]byte, error) {
	start, stop, err := bounds(doc, name)
	if err != nil {
		return nil, err
	}
	return slices.Concat(doc[:start], []byte(body), doc[stop:]), nil
}

// bounds returns the offsets in doc of the first byte after section name's
// begin marker line and of its end marker line.
func bounds(doc []byte, name string) (start, stop int, err error) {
	begin, end := markers(name)
	start, stop = -1, -1
	off := 0
	for _, line := range strings.SplitAfter(string(doc), "\n") {
		switch strings.TrimSuffix(line, "\n") {
		case begin:
			if start >= 0 {
				return 0, 0, fmt.Errorf("section %s: %q twice", name, begin)
			}
			start = off + len(line)
		case end:
			if stop >= 0 {
				return 0, 0, fmt.Errorf("section %s: %q twice", name, end)
			}
			stop = off
		}
		off += len(line)
	}
	switch {
	case start < 0 || stop < 0:
		return 0, 0, fmt.Errorf("section %s: want the lines %q and %q", name, begin, end)
	case stop < start:
		return 0, 0, fmt.Errorf("section %s: %q before %q", name, end, begin)
	}
	return start, stop, nil
}

// Sync keeps the section name of the Markdown file at path equal, byte for
// byte, to the table of spec's variables between two empty lines
// (so that the markers stand apart from the table). With update false it
// only reads, and returns an error listing the rows that differ; with update
// true it rewrites that section, and nothing else of the file, when it
// differs. Each function's configuration test calls it for its own section
// (with update from its -update flag); run those tests one at a time when
// updating, as they write one file.
func Sync(path, name string, spec any, update bool) error {
	vars, err := Vars(spec)
	if err != nil {
		return err
	}
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	have, err := section(doc, name)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	want := "\n" + table(vars) + "\n"
	if have == want {
		return nil
	}
	if !update {
		return fmt.Errorf("%s: section %s is not what the code says (regenerate it: make docs):\n%s", path, name, diff(have, want))
	}
	out, err := replaceSection(doc, name, want)
	if err != nil {
		return err
	}
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, info.Mode().Perm())
}

// diff lists the lines of want that have lacks ("+") and those of have that
// want lacks ("-"); the same lines in another order say so.
func diff(have, want string) string {
	h, w := strings.Split(have, "\n"), strings.Split(want, "\n")
	var out []string
	for _, l := range w {
		if !slices.Contains(h, l) {
			out = append(out, "+ "+l)
		}
	}
	for _, l := range h {
		if !slices.Contains(w, l) {
			out = append(out, "- "+l)
		}
	}
	if len(out) == 0 {
		return "the same lines in another order"
	}
	return strings.Join(out, "\n")
}
