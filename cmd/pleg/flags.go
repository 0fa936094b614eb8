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
	"github.com/podlifecycle/pleg/forecast"
	"github.com/podlifecycle/pleg/internal/app/httpapi"
)

// Flag defaults and bounds.
const (
	// minRelistPeriod keeps relists from running back to back (the
	// kubelet relists every second; benchmarks and tests go down to 20ms).
	minRelistPeriod = 10 * time.Millisecond
	// maxParallelInspections bounds --max-parallel-inspections: each
	// inspection makes up to 4 status calls at once, so 256 is up to 1,024
	// calls in flight, more than any runtime serves usefully (the kubelet
	// makes one at a time).
	maxParallelInspections = 256
	// maxConnections bounds --max-connections: each connection costs about
	// 30 KiB of pleg's memory and up to 64 KiB of kernel buffers (10,000:
	// about 1 GiB at worst, far beyond the DaemonSet's limit of 128 MiB).
	maxConnections = 10000
	// minClientTimeout bounds the --timeout of the commands that ask the
	// daemon: below it, a healthy daemon on a busy node cannot answer.
	minClientTimeout = 100 * time.Millisecond

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
	maxRelistPeriod      time.Duration
	relistThreshold      time.Duration
	maxParallel          int
	podInspectionTimeout time.Duration
	// kubeletRequestTimeout is the kubelet's --runtime-request-timeout,
	// for the forecast of its PLEG.
	kubeletRequestTimeout time.Duration
	fullInspection        bool
	events                string
	listStreaming         string
	directLists           bool
	budget                budgetFlags
	// fs is the flag set the flags were added to: validate asks it
	// whether --max-relist-period was given.
	fs *pflag.FlagSet
}

// budgetFlags are the hint budget's flags (docs/semantics.md, "Hints and
// their budget"), of `pleg run`, `pleg watch` and `pleg bench`. Their
// ranges are checked as they are parsed.
type budgetFlags struct {
	podRelistRate    float64
	podRelistBurst   int
	podRelistSpacing time.Duration
	earlyRelistGap   time.Duration
}

func (f *budgetFlags) addFlags(fs *pflag.FlagSet) {
	floatVar(fs, &f.podRelistRate, "pod-relist-rate", pleg.DefaultPodRelistRate, 0, 10000,
		"single-pod relists a second that hints (runtime events) may make (0: no limit)")
	intVar(fs, &f.podRelistBurst, "pod-relist-burst", pleg.DefaultPodRelistBurst, 1, 10000,
		"single-pod relists hints may make at once")
	durationVar(fs, &f.podRelistSpacing, "pod-relist-spacing", pleg.DefaultPodRelistSpacing, time.Millisecond, time.Minute,
		"after a single-pod relist of a pod that found nothing, the least time before another (0: none)", special[time.Duration]{0, "none"})
	durationVar(fs, &f.earlyRelistGap, "early-relist-gap", pleg.DefaultEarlyRelistGap, time.Millisecond, time.Hour,
		"when hints wait for the budget, start the next global relist this long after the last one ended instead of a period after (0: never early)",
		special[time.Duration]{0, "never early"})
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
	durationVar(fs, &f.requestTimeout, "runtime-request-timeout", defaultRequestTimeout, 100*time.Millisecond, time.Hour,
		"timeout of each unary CRI call")
	durationVar(fs, &f.kubeletRequestTimeout, "kubelet-runtime-request-timeout", forecast.DefaultRequestTimeout, time.Second, time.Hour,
		"the kubelet's --runtime-request-timeout: what one hanging call costs its relist in the forecast of its PLEG (docs/forecast.md)")
	durationVar(fs, &f.relistPeriod, "relist-period", pleg.DefaultRelistPeriod, minRelistPeriod, 10*time.Minute,
		"period between the end of a relist and the start of the next")
	f.fs = fs
	durationVar(fs, &f.maxRelistPeriod, "max-relist-period", pleg.DefaultMaxRelistPeriod, minRelistPeriod, pleg.MaxMaxRelistPeriod,
		"adaptive relist: while the runtime's event stream is connected and relists find nothing no event announced, the period doubles after each relist up to this (at least --relist-period, below half --relist-threshold; not given: 30s, or a quarter of --relist-threshold when less, off when that is below --relist-period; 0: off, every --relist-period)",
		special[time.Duration]{0, "off"})
	durationVar(fs, &f.relistThreshold, "relist-threshold", pleg.DefaultRelistThreshold, time.Second, time.Hour,
		"PLEG is unhealthy when no relist has succeeded for longer than this (at least twice --relist-period)")
	intVar(fs, &f.maxParallel, "max-parallel-inspections", pleg.DefaultMaxParallelInspections, 1, maxParallelInspections,
		"how many changed pods a relist inspects at once (1: one after another, as the kubelet does)")
	durationVar(fs, &f.podInspectionTimeout, "pod-inspection-timeout", pleg.DefaultPodInspectionTimeout, 10*time.Millisecond, time.Hour,
		"how long a relist waits for one pod's status before retrying it on a later relist (0: no limit, as the kubelet)",
		special[time.Duration]{0, "no limit"})
	fs.BoolVar(&f.fullInspection, "full-inspection", false,
		"fetch the status of every sandbox and container of a changed pod, as the kubelet does (default: only those whose listing changed)")
	fs.Var(newEnumValue(&f.events, "auto", "auto", "on", "off"), "events",
		"use the runtime's container events to relist changed pods early: auto (when the runtime streams them), on, off")
	f.budget.addFlags(fs)
	fs.Var(newEnumValue(&f.listStreaming, "auto", "auto", "on", "off"), "list-streaming",
		"list through the runtime's streaming list RPCs (KEP-5825), in batches, so no 16 MiB message limit bounds the node: auto (when the runtime has them), on, off")
	fs.BoolVar(&f.directLists, "direct-lists", true,
		"read the relist's listings from a connection of their own and decode them as they arrive; false: through the gRPC connection, which holds each reply whole before decoding it")
}

// listStreamingMode is --list-streaming as the CRI client's option.
func (f *runtimeFlags) listStreamingMode() cri.ListStreaming {
	m, err := cri.ParseListStreaming(f.listStreaming)
	if err != nil { // the flag accepts the three words only
		return cri.ListStreamingAuto
	}
	return m
}

// validate checks the values pflag cannot; its errors are usage errors.
func (f *runtimeFlags) validate() error {
	// Dial does no I/O: an error here is a malformed endpoint.
	c, err := cri.Dial(f.endpoint)
	if err != nil {
		return usageErrorf("invalid --container-runtime-endpoint %q: %v", f.endpoint, endpointReason(err))
	}
	_ = c.Close()
	// The ranges of each flag are checked as it is parsed; what is left is
	// how flags fit together.
	if f.relistThreshold < 2*f.relistPeriod {
		// Relists start a period plus a relist's duration apart.
		return usageErrorf("invalid --relist-threshold %q: must be at least twice --relist-period (%v), or a healthy node's relists report PLEG unhealthy",
			f.relistThreshold, f.relistPeriod)
	}
	if f.fs == nil || !f.fs.Changed("max-relist-period") {
		f.maxRelistPeriod = defaultMaxRelistPeriod(f.relistPeriod, f.relistThreshold)
	}
	if m := f.maxRelistPeriod; m != 0 && (m < f.relistPeriod || 2*m >= f.relistThreshold) {
		return usageErrorf("invalid --max-relist-period %q: must be at least --relist-period (%v) and below half --relist-threshold (%v)",
			m, f.relistPeriod, f.relistThreshold)
	}
	return nil
}

// defaultMaxRelistPeriod is --max-relist-period when not given: the
// default, or a quarter of the threshold when less (the default must fit
// any --relist-threshold the user gives); 0, off, when that is below the
// period.
func defaultMaxRelistPeriod(period, threshold time.Duration) time.Duration {
	m := min(pleg.DefaultMaxRelistPeriod, threshold/4)
	if m < period {
		return 0
	}
	return m
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
		MaxRelistPeriod:        f.maxRelistPeriod,
		RelistThreshold:        f.relistThreshold,
		MaxParallelInspections: f.maxParallel,
		PodInspectionTimeout:   f.podInspectionTimeout,
		FullInspection:         f.fullInspection,
		Events:                 pleg.EventsMode(f.events),
		KubeletRequestTimeout:  f.kubeletRequestTimeout,
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
	maxConnections int
	allowedHosts   []string
}

func (f *listenFlags) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.address, "listen-address", defaultListenAddress,
		"host:port to serve everything on: /healthz, /readyz, /metrics, the pod API /api/v1/ and the dashboard (port 0 picks a free port); keep it on loopback, the pod API has no authentication")
	fs.StringVar(&f.metricsAddress, "metrics-address", "",
		"host:port to serve only /healthz, /readyz and /metrics on, e.g. 0.0.0.0:10266 for Prometheus and the kubelet's probes (empty: none)")
	fs.StringVar(&f.nodeName, "node-name", "",
		"node name for the kubelet_node_name metric (default: the hostname, lower-cased)")
	intVar(fs, &f.maxConnections, "max-connections", httpapi.DefaultMaxConnections, 8, maxConnections,
		"connections each listener serves at once; past it the idle one that waited longest is closed, and new ones are refused while every one is in a request")
	fs.StringSliceVar(&f.allowedHosts, "allowed-hosts", nil,
		"Host headers --listen-address answers besides loopback addresses and localhost (any port), comma-separated: host names or IPs without a port, or * for any; others get 421 (a defence against DNS rebinding)")
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
	for _, h := range f.allowedHosts {
		if err := httpapi.ValidateAllowedHost(h); err != nil {
			return usageErrorf("invalid --allowed-hosts: %v", err)
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

// serverConfig is the HTTP server's configuration for the daemon d.
func (f *listenFlags) serverConfig(d *daemon) httpapi.Config {
	c := httpapi.Config{
		Generator:      d.gen,
		Readiness:      d.ready,
		Logger:         d.log.WithName("http"),
		MaxConnections: f.maxConnections,
		AllowedHosts:   f.allowedHosts,
	}
	if d.reg != nil { // a nil *Registry would be a non-nil interface
		c.Gatherer, c.Registerer = d.reg, d.reg
	}
	return c
}

// outputFlag is the --output flag of commands that print.
type outputFlag struct{ format string }

func (f *outputFlag) addFlags(fs *pflag.FlagSet) {
	fs.VarP(newEnumValue(&f.format, "text", "text", "json"), "output", "o",
		"output format: text (aligned lines for people) or json (one JSON object a line)")
}
