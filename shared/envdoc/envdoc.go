// Package envdoc describes a function's environment variables from its
// envconfig specification: for the -help output, and to keep README.md's
// configuration table true to the code.
package envdoc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
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
	"{{range .}}{{.Key}}\t{{.Tags.Get \"default\"}}\t{{.Tags.Get \"required\"}}\t{{.Tags.Get \"desc\"}}\n{{end}}"))

// Vars lists the variables of spec (a pointer to an envconfig struct) under
// prefix, as envconfig itself resolves their names.
func Vars(prefix string, spec any) ([]Var, error) {
	var out bytes.Buffer
	if err := envconfig.Usaget(prefix, spec, &out, listing); err != nil {
		return nil, err
	}
	var vars []Var
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), "\t", 4)
		if len(f) != 4 {
			continue
		}
		vars = append(vars, Var{Name: f[0], Default: f[1], Required: f[2] == "true", Desc: f[3]})
	}
	return vars, sc.Err()
}

// Process fills spec from the environment with envconfig.Process. A missing
// required variable is reported by its full prefixed name, all of them at
// once, before any value that does not parse. Only when envconfig.Process
// fails are the variables listed (Vars renders a template over every field:
// a cost every start would pay otherwise); on error spec may be partly
// filled.
func Process(prefix string, spec any) error {
	perr := envconfig.Process(prefix, spec)
	if perr == nil {
		return nil
	}
	vars, err := Vars(prefix, spec)
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
func Usage(w io.Writer, prefix string, spec any) error {
	vars, err := Vars(prefix, spec)
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

// Row is how README.md documents v: "| `NAME` | default | description |",
// where default is the value in backticks, "required", or empty.
func Row(v Var) string {
	def := ""
	switch {
	case v.Required:
		def = "required"
	case v.Default != "":
		def = "`" + v.Default + "`"
	}
	return fmt.Sprintf("| `%s` | %s | %s |", v.Name, def, v.Desc)
}

// CheckDocumented returns an error listing every variable of vars whose row
// in doc is missing or differs from Row(v).
func CheckDocumented(doc []byte, vars []Var) error {
	lines := map[string]bool{}
	for _, l := range strings.Split(string(doc), "\n") {
		lines[strings.TrimSpace(l)] = true
	}
	var missing []string
	for _, v := range vars {
		if !lines[Row(v)] {
			missing = append(missing, Row(v))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("README.md lacks these configuration rows (or they differ):\n%s", strings.Join(missing, "\n"))
	}
	return nil
}

// CheckFile is CheckDocumented for the variables of spec under prefix
// against the file at path (README.md).
func CheckFile(path, prefix string, spec any) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	vars, err := Vars(prefix, spec)
	if err != nil {
		return err
	}
	return CheckDocumented(doc, vars)
}
