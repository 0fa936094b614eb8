package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Every numeric flag of every command is one of the values below, which
// carry the flag's range: a value outside it is a flag parse error (exit
// 2) in one line that states the range, e.g.
//
//	pleg: invalid argument "1099511627776" for "--max-parallel-inspections" flag: must be from 1 to 256
//
// TestEveryNumericFlagHasARange keeps it so.

// rangedValue is a pflag.Value that checks a range.
type rangedValue interface {
	pflag.Value
	// Range describes the accepted values ("from 1 to 256").
	Range() string
}

// intFlag is an int flag within [min, max], or one of the special values.
type intFlag struct {
	p        *int
	min, max int
	special  []special[int]
}

// special is a value accepted outside a flag's range, and what it means.
type special[T any] struct {
	v       T
	meaning string
}

func intVar(fs *pflag.FlagSet, p *int, name string, def, min, max int, usage string, specials ...special[int]) {
	*p = def
	fs.Var(&intFlag{p: p, min: min, max: max, special: specials}, name, usage)
}

func (f *intFlag) Type() string   { return "int" }
func (f *intFlag) String() string { return strconv.Itoa(*f.p) }
func (f *intFlag) Range() string {
	return specialsText(f.special, strconv.Itoa) + fmt.Sprintf("from %d to %d", f.min, f.max)
}
func (f *intFlag) Set(s string) error {
	v, err := strconv.ParseInt(s, 10, 0)
	if err != nil || !f.accepts(int(v)) {
		return fmt.Errorf("must be %s", f.Range())
	}
	*f.p = int(v)
	return nil
}

func (f *intFlag) accepts(v int) bool {
	for _, s := range f.special {
		if v == s.v {
			return true
		}
	}
	return v >= f.min && v <= f.max
}

// durationFlag is a duration flag within [min, max], or one of the special
// values.
type durationFlag struct {
	p        *time.Duration
	min, max time.Duration
	special  []special[time.Duration]
}

func durationVar(fs *pflag.FlagSet, p *time.Duration, name string, def, min, max time.Duration, usage string, specials ...special[time.Duration]) {
	*p = def
	fs.Var(&durationFlag{p: p, min: min, max: max, special: specials}, name, usage)
}

func (f *durationFlag) Type() string   { return "duration" }
func (f *durationFlag) String() string { return f.p.String() }
func (f *durationFlag) Range() string {
	return specialsText(f.special, shortDuration) + fmt.Sprintf("from %s to %s", shortDuration(f.min), shortDuration(f.max))
}
func (f *durationFlag) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("not a duration (e.g. 500ms, 2m): must be %s", f.Range())
	}
	for _, sp := range f.special {
		if v == sp.v {
			*f.p = v
			return nil
		}
	}
	if v < f.min || v > f.max {
		return fmt.Errorf("must be %s", f.Range())
	}
	*f.p = v
	return nil
}

// floatFlag is a float flag within [min, max].
type floatFlag struct {
	p        *float64
	min, max float64
}

func floatVar(fs *pflag.FlagSet, p *float64, name string, def, min, max float64, usage string) {
	*p = def
	fs.Var(&floatFlag{p: p, min: min, max: max}, name, usage)
}

func (f *floatFlag) Type() string   { return "float" }
func (f *floatFlag) String() string { return strconv.FormatFloat(*f.p, 'g', -1, 64) }
func (f *floatFlag) Range() string {
	return fmt.Sprintf("from %s to %s", strconv.FormatFloat(f.min, 'g', -1, 64), strconv.FormatFloat(f.max, 'g', -1, 64))
}
func (f *floatFlag) Set(s string) error {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || v < f.min || v > f.max {
		return fmt.Errorf("must be a number %s", f.Range())
	}
	*f.p = v
	return nil
}

// uint64Flag is a uint64 flag whose every value is sane (a seed).
type uint64Flag struct{ p *uint64 }

func uint64Var(fs *pflag.FlagSet, p *uint64, name string, def uint64, usage string) {
	*p = def
	fs.Var(&uint64Flag{p}, name, usage)
}

func (f *uint64Flag) Type() string   { return "uint64" }
func (f *uint64Flag) String() string { return strconv.FormatUint(*f.p, 10) }
func (f *uint64Flag) Range() string  { return fmt.Sprintf("from 0 to %d", uint64(math.MaxUint64)) }
func (f *uint64Flag) Set(s string) error {
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return fmt.Errorf("must be an integer %s", f.Range())
	}
	*f.p = v
	return nil
}

// levelFlag wraps klog's -v with a range.
type levelFlag struct {
	pflag.Value
	max int
}

func (f *levelFlag) Range() string { return fmt.Sprintf("from 0 to %d", f.max) }
func (f *levelFlag) Set(s string) error {
	v, err := strconv.Atoi(s)
	if err != nil || v < 0 || v > f.max {
		return fmt.Errorf("must be %s", f.Range())
	}
	return f.Value.Set(s)
}

// specialsText is "0 (no limit) or " for the special values.
func specialsText[T any](specials []special[T], format func(T) string) string {
	var b strings.Builder
	for _, s := range specials {
		fmt.Fprintf(&b, "%s (%s) or ", format(s.v), s.meaning)
	}
	return b.String()
}

// shortDuration formats d without trailing zero units: 1h, 5m, 1m30s,
// 100ms.
func shortDuration(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
