package main

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// numericTypes are the pflag type names of numeric values (klog's -v is
// "Level").
var numericTypes = map[string]bool{"int": true, "int8": true, "int16": true, "int32": true, "int64": true,
	"uint": true, "uint8": true, "uint16": true, "uint32": true, "uint64": true, "float": true, "float32": true,
	"float64": true, "duration": true, "count": true, "Level": true}

// eachFlag calls f for every flag of every command.
func eachFlag(cmd *cobra.Command, f func(cmd *cobra.Command, fl *pflag.Flag)) {
	cmd.Flags().VisitAll(func(fl *pflag.Flag) { f(cmd, fl) })
	cmd.PersistentFlags().VisitAll(func(fl *pflag.Flag) { f(cmd, fl) })
	for _, c := range cmd.Commands() {
		eachFlag(c, f)
	}
}

// Every numeric flag of every command checks a range, refusing values far
// beyond it (the OOM of --max-parallel-inspections=1099511627776, the busy
// loop of --relist-period=1ns) with a message that states the range, and
// its default is within it.
func TestEveryNumericFlagHasARange(t *testing.T) {
	n := 0
	eachFlag(newRootCmd(), func(cmd *cobra.Command, fl *pflag.Flag) {
		if !numericTypes[fl.Value.Type()] {
			return
		}
		name := cmd.CommandPath() + " --" + fl.Name
		rv, ok := fl.Value.(rangedValue)
		if !ok {
			t.Errorf("%s (%s) has no range", name, fl.Value.Type())
			return
		}
		n++
		if err := fl.Value.Set(fl.DefValue); err != nil {
			t.Errorf("%s: its default %q is out of its range: %v", name, fl.DefValue, err)
		}
		huge := []string{"1099511627776", "-1099511627776"}
		switch fl.Value.Type() {
		case "duration":
			huge = []string{"-1h", "2562047h"}
		case "float":
			huge = []string{"NaN", "-Inf", "1e300"}
		case "uint64":
			huge = []string{"-1", "18446744073709551616"} // every uint64 is a valid seed
		}
		for _, v := range huge {
			err := fl.Value.Set(v)
			if err == nil {
				t.Errorf("%s=%s accepted (range %s)", name, v, rv.Range())
				continue
			}
			if !strings.Contains(err.Error(), rv.Range()) {
				t.Errorf("%s=%s: error %q does not state the range %q", name, v, err, rv.Range())
			}
		}
	})
	if n < 30 {
		t.Errorf("only %d numeric flags found: the walk misses commands", n)
	}
}

func TestRanges(t *testing.T) {
	var i int
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	intVar(fs, &i, "n", 10, 1, 100, "", special[int]{-1, "all"})
	for v, ok := range map[string]bool{"1": true, "100": true, "-1": true, "0": false, "101": false, "x": false,
		strconv.FormatInt(math.MaxInt64, 10): false, "99999999999999999999": false} {
		if err := fs.Set("n", v); (err == nil) != ok {
			t.Errorf("--n=%s: %v", v, err)
		} else if err != nil && !strings.HasSuffix(err.Error(), `flag: must be -1 (all) or from 1 to 100`) {
			t.Errorf("--n=%s: %q", v, err)
		}
	}
	if err := fs.Set("n", "-1"); err != nil || i != -1 {
		t.Errorf("--n=-1: %v, value %d", err, i)
	}
	if err := fs.Set("n", "101"); err == nil || i != -1 {
		t.Errorf("--n=101 after -1: %v, value %d; want an error and the value kept", err, i)
	}
	for d, want := range map[string]string{"0s": "0", "1h0m0s": "1h", "10m0s": "10m", "1m30s": "1m30s", "100ms": "100ms", "2h30m0s": "2h30m"} {
		if dd, _ := timeParse(d); shortDuration(dd) != want {
			t.Errorf("shortDuration(%s) = %q, want %q", d, shortDuration(dd), want)
		}
	}
}

func timeParse(s string) (time.Duration, error) { return time.ParseDuration(s) }

// TestMaxRelistPeriodDefault: the adaptive relist is on by default, at
// pleg.DefaultMaxRelistPeriod; a --relist-threshold or --relist-period
// the default does not fit moves it (a quarter of the threshold) or turns
// it off, where the same value given explicitly is refused; given, it is
// taken as is.
func TestMaxRelistPeriodDefault(t *testing.T) {
	for _, c := range []struct {
		args []string
		want time.Duration
	}{
		{nil, 30 * time.Second},
		{[]string{"--relist-threshold=1m"}, 15 * time.Second},
		{[]string{"--relist-period=20s", "--relist-threshold=1m"}, 0},
		{[]string{"--max-relist-period=0"}, 0},
		{[]string{"--max-relist-period=10s"}, 10 * time.Second},
		{[]string{"--relist-period=100ms", "--max-relist-period=2s"}, 2 * time.Second},
	} {
		var f runtimeFlags
		fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
		f.addFlags(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if err := f.validate(); err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if got := f.generatorOptions().MaxRelistPeriod; got != c.want {
			t.Errorf("%v: MaxRelistPeriod %v, want %v", c.args, got, c.want)
		}
	}
}
