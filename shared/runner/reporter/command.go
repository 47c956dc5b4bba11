package reporter

import "strings"

// parseCommand recognises a workflow command line, "::name props::value" or
// "##[name props]value" (leading white space allowed), and returns its name
// as written and its raw (still escaped) value.
func parseCommand(line string) (name, value string, ok bool) {
	line = strings.TrimLeft(line, " \t")
	var header string
	switch {
	case strings.HasPrefix(line, "::"):
		rest := line[2:]
		i := strings.Index(rest, "::")
		if i <= 0 {
			return "", "", false
		}
		header, value = rest[:i], rest[i+2:]
	case strings.HasPrefix(line, "##["):
		rest := line[3:]
		i := strings.IndexByte(rest, ']')
		if i <= 0 {
			return "", "", false
		}
		header, value = rest[:i], rest[i+1:]
	default:
		return "", "", false
	}
	name, _, _ = strings.Cut(header, " ")
	if name == "" {
		return "", "", false
	}
	return name, value, true
}

// commandData undoes the escaping of a workflow command's value.
var commandData = strings.NewReplacer("%0D", "\r", "%0A", "\n", "%25", "%")
