package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/cruntime/cri"
)

// Flag defaults.
const (
	defaultRuntimeEndpoint = "unix:///run/containerd/containerd.sock"
	defaultRequestTimeout  = 2 * time.Minute
	// defaultListenAddress is loopback only. Port 10265 is not taken by any
	// Kubernetes component: the kubelet has 10248 (healthz), 10250 and 10255,
	// kube-proxy 10249 and 10256, kube-controller-manager 10257,
	// cloud-controller-manager 10258, kube-scheduler 10259, and ingress-nginx
	// commonly 10254.
	defaultListenAddress = "127.0.0.1:10265"
)

// enumValue is a pflag.Value that accepts one of a fixed set of words, so
// that a bad value is a flag parse error (exit 2) naming the choices.
type enumValue struct {
	value   *string
	allowed []string
}

func newEnumValue(p *string, def string, allowed ...string) *enumValue {
	*p = def
	return &enumValue{value: p, allowed: allowed}
}

func (e *enumValue) String() string { return *e.value }
func (e *enumValue) Type() string   { return "string" }
func (e *enumValue) Set(s string) error {
	for _, a := range e.allowed {
		if s == a {
			*e.value = s
			return nil
		}
	}
	return fmt.Errorf("must be one of %s", strings.Join(e.allowed, ", "))
}

// runtimeFlags are the flags of every command that runs a generator
// against a CRI runtime.
type runtimeFlags struct {
	endpoint             string
	requestTimeout       time.Duration
	relistPeriod         time.Duration
	relistThreshold      time.Duration
	maxParallel          int
	podInspectionTimeout time.Duration
	fullInspection       bool
	events               string
	budget               budgetFlags
}

// budgetFlags are the hint budget's flags (docs/semantics.md, "Hints and
// their budget"), of `pleg run`, `pleg watch` and `pleg bench`.
type budgetFlags struct {
	podRelistRate    float64
	podRelistBurst   int
	podRelistSpacing time.Duration
	earlyRelistGap   time.Duration
}

func (f *budgetFlags) addFlags(fs *pflag.FlagSet) {
	fs.Float64Var(&f.podRelistRate, "pod-relist-rate", pleg.DefaultPodRelistRate,
		"single-pod relists a second that hints (runtime events) may make (0: no limit)")
	fs.IntVar(&f.podRelistBurst, "pod-relist-burst", pleg.DefaultPodRelistBurst,
		"single-pod relists hints may make at once")
	fs.DurationVar(&f.podRelistSpacing, "pod-relist-spacing", pleg.DefaultPodRelistSpacing,
		"least time between two single-pod relists of one pod (0: none)")
	fs.DurationVar(&f.earlyRelistGap, "early-relist-gap", pleg.DefaultEarlyRelistGap,
		"when hints wait for the budget, start the next global relist this long after the last one ended instead of a period after (0: never early)")
}

func (f *budgetFlags) validate() error {
	switch {
	case f.podRelistRate < 0 || f.podRelistRate > 10000 || f.podRelistRate != f.podRelistRate:
		return usageErrorf("invalid --pod-relist-rate %v: must be from 0 (no limit) to 10000 a second", f.podRelistRate)
	case f.podRelistBurst < 1 || f.podRelistBurst > 10000:
		return usageErrorf("invalid --pod-relist-burst %d: must be from 1 to 10000", f.podRelistBurst)
	case f.podRelistSpacing < 0 || f.podRelistSpacing > time.Minute:
		return usageErrorf("invalid --pod-relist-spacing %q: must be from 0 to 1m", f.podRelistSpacing)
	case f.earlyRelistGap < 0 || f.earlyRelistGap > time.Hour:
		return usageErrorf("invalid --early-relist-gap %q: must be from 0 (never early) to 1h", f.earlyRelistGap)
	}
	return nil
}

// options returns the budget as the library reads it: there 0 is
// "default", on the command line "none" (negative for the library).
func (f *budgetFlags) options() (rate float64, burst int, spacing, early time.Duration) {
	rate, burst, spacing, early = f.podRelistRate, f.podRelistBurst, f.podRelistSpacing, f.earlyRelistGap
	if rate == 0 {
		rate = -1
	}
	if spacing == 0 {
		spacing = -1
	}
	if early == 0 {
		early = -1
	}
	return rate, burst, spacing, early
}

func (f *runtimeFlags) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.endpoint, "container-runtime-endpoint", defaultRuntimeEndpoint,
		"CRI runtime endpoint (a unix socket: unix:///path/to/socket)")
	// crictl's names for the same flag.
	fs.StringVarP(&f.endpoint, "runtime-endpoint", "r", defaultRuntimeEndpoint,
		"alias of --container-runtime-endpoint (crictl's name)")
	fs.DurationVar(&f.requestTimeout, "runtime-request-timeout", defaultRequestTimeout,
		"timeout of each unary CRI call")
	fs.DurationVar(&f.relistPeriod, "relist-period", pleg.DefaultRelistPeriod,
		"period between the end of a relist and the start of the next")
	fs.DurationVar(&f.relistThreshold, "relist-threshold", pleg.DefaultRelistThreshold,
		"PLEG is unhealthy when no relist has succeeded for longer than this")
	fs.IntVar(&f.maxParallel, "max-parallel-inspections", pleg.DefaultMaxParallelInspections,
		"how many changed pods a relist inspects at once (1: one after another, as the kubelet does)")
	fs.DurationVar(&f.podInspectionTimeout, "pod-inspection-timeout", pleg.DefaultPodInspectionTimeout,
		"how long a relist waits for one pod's status before retrying it on a later relist (0: no limit, as the kubelet)")
	fs.BoolVar(&f.fullInspection, "full-inspection", false,
		"fetch the status of every sandbox and container of a changed pod, as the kubelet does (default: only those whose listing changed)")
	fs.Var(newEnumValue(&f.events, "auto", "auto", "on", "off"), "events",
		"use the runtime's container events to relist changed pods early: auto (when the runtime streams them), on, off")
	f.budget.addFlags(fs)
}

// validate checks the values pflag cannot; its errors are usage errors.
func (f *runtimeFlags) validate() error {
	// Dial does no I/O: an error here is a malformed endpoint.
	c, err := cri.Dial(f.endpoint)
	if err != nil {
		return usageErrorf("invalid --container-runtime-endpoint %q: %v", f.endpoint, endpointReason(err))
	}
	_ = c.Close()
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"runtime-request-timeout", f.requestTimeout},
		{"relist-period", f.relistPeriod},
		{"relist-threshold", f.relistThreshold},
	} {
		if d.v <= 0 {
			return usageErrorf("invalid --%s %q: must be greater than zero", d.name, d.v)
		}
	}
	if f.podInspectionTimeout < 0 {
		return usageErrorf("invalid --pod-inspection-timeout %q: must not be negative (0 disables it)", f.podInspectionTimeout)
	}
	if f.maxParallel < 1 {
		return usageErrorf("invalid --max-parallel-inspections %d: must be at least 1", f.maxParallel)
	}
	return f.budget.validate()
}

// endpointReason is what is wrong with an endpoint Dial refused, without
// the endpoint, which the usage error already names.
func endpointReason(err error) string {
	var ee *cri.EndpointError
	if errors.As(err, &ee) {
		return ee.Reason
	}
	return err.Error()
}

// validateAddress checks a host:port flag.
func validateAddress(flag, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return usageErrorf("invalid --%s %q: %v", flag, addr, err)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && port != "0") {
		return usageErrorf("invalid --%s %q: port must be a number from 0 to 65535", flag, addr)
	}
	if host != "" && net.ParseIP(host) == nil && strings.ContainsAny(host, " /") {
		return usageErrorf("invalid --%s %q: bad host %q", flag, addr, host)
	}
	return nil
}

// loopbackOnly reports whether a listen address serves loopback only.
func loopbackOnly(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// generatorOptions returns the generator options the flags set.
func (f *runtimeFlags) generatorOptions() pleg.Options {
	o := pleg.Options{
		RelistPeriod:           f.relistPeriod,
		RelistThreshold:        f.relistThreshold,
		MaxParallelInspections: f.maxParallel,
		PodInspectionTimeout:   f.podInspectionTimeout,
		FullInspection:         f.fullInspection,
		Events:                 pleg.EventsMode(f.events),
	}
	o.PodRelistRate, o.PodRelistBurst, o.PodRelistSpacing, o.EarlyRelistGap = f.budget.options()
	// The library reads 0 as "default"; on the command line it is "none".
	if o.PodInspectionTimeout == 0 {
		o.PodInspectionTimeout = -1
	}
	return o
}

// dialTimeout bounds the reachability check of commands that need the
// runtime at start.
func (f *runtimeFlags) dialTimeout() time.Duration {
	return min(f.requestTimeout, 10*time.Second)
}

// listenFlags are the flags of commands that serve HTTP.
type listenFlags struct {
	address        string
	metricsAddress string
	nodeName       string
}

func (f *listenFlags) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.address, "listen-address", defaultListenAddress,
		"host:port to serve everything on: /healthz, /readyz, /metrics, the pod API /api/v1/ and the dashboard (port 0 picks a free port); keep it on loopback, the pod API has no authentication")
	fs.StringVar(&f.metricsAddress, "metrics-address", "",
		"host:port to serve only /healthz, /readyz and /metrics on, e.g. 0.0.0.0:10266 for Prometheus and the kubelet's probes (empty: none)")
	fs.StringVar(&f.nodeName, "node-name", "",
		"node name for the kubelet_node_name metric (default: the hostname, lower-cased)")
}

func (f *listenFlags) validate() error {
	if err := validateAddress("listen-address", f.address); err != nil {
		return err
	}
	if f.metricsAddress != "" {
		if err := validateAddress("metrics-address", f.metricsAddress); err != nil {
			return err
		}
	}
	if f.nodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("cannot determine the node name (set --node-name): %w", err)
		}
		f.nodeName = strings.ToLower(strings.TrimSpace(h))
	}
	return nil
}

// outputFlag is the --output flag of commands that print.
type outputFlag struct{ format string }

func (f *outputFlag) addFlags(fs *pflag.FlagSet) {
	fs.VarP(newEnumValue(&f.format, "text", "text", "json"), "output", "o",
		"output format: text (aligned lines for people) or json (one JSON object a line)")
}
