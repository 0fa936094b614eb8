package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/cruntime/cri"
	"github.com/podlifecycle/pleg/metrics"
)

// A relister runs one column of a scenario: one generator, relisting on
// demand against the simulated runtime's endpoint. pleg's runs either in
// this process (Options.InProcess) or in a child process (this binary
// re-executed, see MaybeServeChild); the kubelet's always runs in its own
// process (the kubelet-relist program of test/kubelet, see Options.Kubelet).
// Both children speak the same line protocol (see ServeRelister).
type relister interface {
	relist(ctx context.Context) (*relistResult, error)
	// watchHealth starts watching health, if the column does, from the
	// next relist on (after the warm-up relists).
	watchHealth() error
	// peakRSS is the process's peak resident set size in bytes; -1 when
	// the generator shares its process with the bench.
	peakRSS() (int64, error)
	// health is what Healthy said around the relists; nil when the
	// column does not watch health.
	health() (*HealthResult, error)
	close() error
}

// relistResult is one relist as its process measured it. Its JSON form is
// the protocol's answer to "relist"; the kubelet-relist program sends the
// same field names.
type relistResult struct {
	WallNs     int64              `json:"wallNs"`
	CPUNs      int64              `json:"cpuNs"`
	Mallocs    uint64             `json:"mallocs"`
	AllocBytes uint64             `json:"allocBytes"`
	Calls      map[string]float64 `json:"calls"` // kubelet_runtime_operations_total by operation_type
	Events     int                `json:"events"`
	// Discarded counts events the generator dropped (the kubelet's full
	// event channel).
	Discarded float64 `json:"discardedEvents"`
	// Inspected counts pods whose status was fetched; ListNs is the
	// listing's round trip; Timeouts counts pod inspection timeouts. The
	// kubelet program does not report them (see kubeletRelister).
	Inspected *int64 `json:"inspected,omitempty"`
	// ListFailed says the relist's listing failed.
	ListFailed bool    `json:"listFailed"`
	ListNs     *int64  `json:"listNs,omitempty"`
	Timeouts   float64 `json:"inspectionTimeouts"`
}

// plegConfig configures pleg's relister.
type plegConfig struct {
	Endpoint          string        `json:"endpoint"`
	RequestTimeout    time.Duration `json:"requestTimeout"`
	Parallel          int           `json:"maxParallelInspections"`
	InspectionTimeout time.Duration `json:"podInspectionTimeout"` // negative: disabled
	RelistThreshold   time.Duration `json:"relistThreshold"`      // positive: watch health
	// ListStreaming is the CRI client's list streaming mode: auto, on or
	// off ("": auto).
	ListStreaming string `json:"listStreaming,omitempty"`
}

// plegRelister is pleg's generator in this process.
type plegRelister struct {
	reg       *prometheus.Registry
	client    *cri.Client
	pr        *probe
	g         *pleg.Generator
	events    <-chan *pleg.Event
	threshold time.Duration
	watch     *healthWatch
}

func newPLEGRelister(c plegConfig) (_ *plegRelister, err error) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	streaming := cri.ListStreamingAuto
	if c.ListStreaming != "" {
		if streaming, err = cri.ParseListStreaming(c.ListStreaming); err != nil {
			return nil, err
		}
	}
	client, err := cri.Dial(c.Endpoint, cri.WithTimeout(c.RequestTimeout), cri.WithMetrics(m),
		cri.WithLogger(logr.Discard()), cri.WithListStreaming(streaming))
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			client.Close()
		}
	}()
	pr := &probe{Runtime: client}
	opts := pleg.Options{
		Runtime:                pr.asRuntime(),
		Metrics:                m,
		MaxParallelInspections: c.Parallel,
		PodInspectionTimeout:   c.InspectionTimeout,
		RelistThreshold:        c.RelistThreshold,
		Events:                 pleg.EventsOff,
	}
	if c.RelistThreshold > 0 {
		// The bench drives relists by hand: the period only has to fit
		// under the threshold, as New requires.
		opts.RelistPeriod = max(pleg.MinRelistPeriod, c.RelistThreshold/2)
	}
	g, err := pleg.New(opts)
	if err != nil {
		return nil, err
	}
	return &plegRelister{reg: reg, client: client, pr: pr, g: g, events: g.Watch(), threshold: c.RelistThreshold}, nil
}

func (p *plegRelister) drain() int {
	n := 0
	for {
		select {
		case <-p.events:
			n++
		default:
			return n
		}
	}
}

func (p *plegRelister) relist(ctx context.Context) (*relistResult, error) {
	if p.watch != nil {
		p.watch.check()
	}
	ops0 := counters(p.reg)
	p.pr.inspected.Store(0)
	var m0, m1 goruntime.MemStats
	goruntime.ReadMemStats(&m0)
	c0 := processCPU()
	t0 := time.Now()
	// A failed relist (listing error) is reported, not fatal, as the
	// kubelet's.
	rerr := p.g.Relist(ctx)
	wall := time.Since(t0)
	c1 := processCPU()
	goruntime.ReadMemStats(&m1)
	p.pr.mu.Lock()
	list := p.pr.lastList
	p.pr.mu.Unlock()
	if p.watch != nil {
		p.watch.relisted(list)
		p.watch.check()
	}
	ops1 := counters(p.reg)
	inspected, listNs := p.pr.inspected.Load(), int64(list)
	r := &relistResult{
		WallNs: int64(wall), CPUNs: int64(c1 - c0),
		Mallocs: m1.Mallocs - m0.Mallocs, AllocBytes: m1.TotalAlloc - m0.TotalAlloc,
		Calls: map[string]float64{}, Events: p.drain(),
		Inspected: &inspected, ListNs: &listNs,
		Timeouts: ops1.timeouts - ops0.timeouts, ListFailed: rerr != nil,
	}
	for op, v := range ops1.ops {
		if d := v - ops0.ops[op]; d > 0 {
			r.Calls[op] = d
		}
	}
	return r, nil
}

// floorResult is what a listing's two calls cost with their replies
// discarded undecoded (cri.Client.ListDiscard), in the relister's process:
// the transport's floor under a relist.
type floorResult struct {
	CPUNs int64 `json:"cpuNs"` // mean per pair of calls
	Bytes int   `json:"bytes"` // both replies
}

// floor makes the bare list calls n times, one pair at a time as a relist
// makes them, on the generator's own connection.
func (p *plegRelister) floor(ctx context.Context, n int) (*floorResult, error) {
	if n < 1 {
		return nil, fmt.Errorf("floor: %d rounds", n)
	}
	var cpu time.Duration
	var bytes int
	for range n {
		c0 := processCPU()
		b, err := p.client.ListDiscard(ctx)
		cpu += processCPU() - c0
		if err != nil {
			return nil, fmt.Errorf("bare list calls: %w", err)
		}
		bytes = b
	}
	return &floorResult{CPUNs: int64(cpu) / int64(n), Bytes: bytes}, nil
}

func (p *plegRelister) watchHealth() error {
	if p.threshold > 0 {
		p.watch = newHealthWatch(p.g, p.threshold)
	}
	return nil
}

func (p *plegRelister) peakRSS() (int64, error) { return -1, nil }

func (p *plegRelister) health() (*HealthResult, error) {
	if p.watch == nil {
		return nil, nil
	}
	return p.watch.result(), nil
}

func (p *plegRelister) close() error {
	// Stop cancels abandoned inspections, so it returns at once even with
	// a hung pod.
	p.g.Stop()
	return p.client.Close()
}

// RelisterEnv is the environment variable that makes a binary serve pleg's
// relister (see MaybeServeChild); its value is the JSON plegConfig.
const RelisterEnv = "PLEG_BENCH_RELISTER_CHILD"

// ServeRelister serves pleg's relister configured by c over the line
// protocol until quit or the end of in. It first answers "ready", then
// each command with "ok[ <result>]" or "error <message>":
//
//	relist   one relist; answers the relistResult as JSON
//	floor N  the bare list calls N times; answers the floorResult as JSON
//	rss      the process's peak resident set size in bytes (VmHWM)
//	rssfile  its resident pages mapped from files in bytes (RssFile)
//	watch    watch health from the next relist on
//	health   what Healthy said around the relists since "watch", as JSON
//	         ("null" when health is not watched)
//	quit     stop
func ServeRelister(c plegConfig, in io.Reader, out io.Writer) error {
	p, err := newPLEGRelister(c)
	if err != nil {
		return err
	}
	defer p.close()
	return serveLines(bufio.NewScanner(in), out, "ready", func(cmd, arg string, reply replyFunc) (err error) {
		switch cmd {
		case "relist":
			var r *relistResult
			// The parent bounds the relist (it kills this process when its
			// context ends); the runtime request timeout bounds every call.
			if r, err = p.relist(context.Background()); err == nil {
				js, _ := json.Marshal(r)
				err = reply("ok %s", js)
			}
		case "floor":
			var n int
			var f *floorResult
			if n, err = strconv.Atoi(arg); err == nil {
				if f, err = p.floor(context.Background(), n); err == nil {
					js, _ := json.Marshal(f)
					err = reply("ok %s", js)
				}
			}
		case "rss":
			var n int64
			if n, err = peakRSS(); err == nil {
				err = reply("ok %d", n)
			}
		case "rssfile":
			var n int64
			if n, err = residentFile(); err == nil {
				err = reply("ok %d", n)
			}
		case "watch":
			if err = p.watchHealth(); err == nil {
				err = reply("ok")
			}
		case "health":
			h, _ := p.health()
			js, _ := json.Marshal(h)
			err = reply("ok %s", js)
		default:
			err = fmt.Errorf("unknown command %q", cmd)
		}
		return err
	})
}

// peakRSS returns VmHWM from /proc/self/status, in bytes.
func peakRSS() (int64, error) { return procStatusBytes("VmHWM") }

// residentFile returns RssFile from /proc/self/status, in bytes: the
// resident pages mapped from files, mostly the binary's own.
func residentFile() (int64, error) { return procStatusBytes("RssFile") }

// procStatusBytes returns a field of /proc/self/status given in kB, in
// bytes.
func procStatusBytes(field string) (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s %q: %w", field, v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no %s in /proc/self/status", field)
}

// procRelister drives a relister in a child process over the protocol.
type procRelister struct {
	lineChild
	name string // for messages: "pleg" or "kubelet"
	// watches says whether the child answers "health".
	watches bool
	done    chan struct{} // closed when cmd has been waited for
	waitErr error
}

// startRelister starts cmd (its stdin, stdout and stderr are set here) and
// waits for "ready". ctx bounds the child's whole life: when it ends, the
// child is killed.
func startRelister(ctx context.Context, name string, cmd *exec.Cmd, watches bool) (*procRelister, error) {
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p := &procRelister{lineChild: lineChild{what: name + " relister", cmd: cmd, in: in, out: bufio.NewReader(out), stderr: &lockedBuffer{}},
		name: name, watches: watches, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the %s relister: %w", name, err)
	}
	go func() {
		<-ctx.Done()
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
		}
	}()
	if _, err := p.read("ready"); err != nil {
		p.kill()
		return nil, err
	}
	return p, nil
}

// requestJSON sends the command line and decodes the JSON of its "ok"
// answer into v.
func (p *procRelister) requestJSON(line string, v any) error {
	js, err := p.request(line, "ok")
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(js), v); err != nil {
		cmd, _, _ := strings.Cut(line, " ")
		return fmt.Errorf("%s relister: %s answer: %w", p.name, cmd, err)
	}
	return nil
}

func (p *procRelister) relist(context.Context) (*relistResult, error) {
	var r relistResult
	if err := p.requestJSON("relist", &r); err != nil {
		return nil, err
	}
	return &r, nil
}

func (p *procRelister) floor(_ context.Context, n int) (*floorResult, error) {
	var f floorResult
	if err := p.requestJSON("floor "+strconv.Itoa(n), &f); err != nil {
		return nil, err
	}
	return &f, nil
}

func (p *procRelister) residentFile() (int64, error) {
	got, err := p.request("rssfile", "ok")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(got, 10, 64)
}

func (p *procRelister) peakRSS() (int64, error) {
	got, err := p.request("rss", "ok")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(got, 10, 64)
}

func (p *procRelister) watchHealth() error {
	if !p.watches {
		return nil
	}
	_, err := p.request("watch", "ok")
	return err
}

func (p *procRelister) health() (*HealthResult, error) {
	if !p.watches {
		return nil, nil
	}
	var h *HealthResult
	if err := p.requestJSON("health", &h); err != nil {
		return nil, err
	}
	return h, nil
}

func (p *procRelister) close() error {
	err := p.quit()
	close(p.done)
	if err != nil {
		return p.failure(err)
	}
	return nil
}

func (p *procRelister) kill() {
	p.lineChild.kill()
	close(p.done)
}

// plegChildCommand re-executes the running binary to serve pleg's
// relister configured by c.
func plegChildCommand(c plegConfig) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding the running binary to run pleg's relister: %w", err)
	}
	js, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), RelisterEnv+"="+string(js))
	return cmd, nil
}

// kubeletCommand runs the kubelet-relist program at path against endpoint.
func kubeletCommand(path, endpoint string, timeout time.Duration) *exec.Cmd {
	return exec.Command(path, "--endpoint", endpoint, "--runtime-request-timeout", timeout.String())
}
