package function

import (
	"flag"
	"fmt"
)

// OutputFlag defines -o on fs, a report's output format: "table" (the
// default, for a person) or "json" (for a program), the two formats
// poolstatus.Report.Write takes. It returns where the value is kept: once
// fs.Parse succeeds it holds one of the two, since the flag refuses any
// other value (fs.Parse's error names the flag and the bad value).
func OutputFlag(fs *flag.FlagSet) *string {
	format := "table"
	fs.Var((*outputFormat)(&format), "o", "output `format`: table or json")
	return &format
}

// outputFormat is the flag.Value of -o.
type outputFormat string

func (f *outputFormat) String() string { return string(*f) }

func (f *outputFormat) Set(s string) error {
	if s != "table" && s != "json" {
		return fmt.Errorf("want table or json")
	}
	*f = outputFormat(s)
	return nil
}
