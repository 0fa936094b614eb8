package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/cruntime/sim"
	"github.com/podlifecycle/pleg/internal/app/dashboard"
	"github.com/podlifecycle/pleg/internal/app/httpapi"
	"github.com/podlifecycle/pleg/internal/stats"
	"github.com/podlifecycle/pleg/internal/textfmt"
)

func init() { register(newDemoCmd) }

// demoScenario is one of the demo's simulated nodes.
type demoScenario struct {
	name, about string
	cfg         sim.Config
	stepEvery   time.Duration // how often the workload churns (0: never)
}

func demoScenarios() []demoScenario {
	return []demoScenario{
		{name: "idle", about: "a node with no pods", cfg: sim.Config{Seed: 1}},
		{name: "busy", about: "66 pods x 7 containers created at once, then churning",
			cfg: sim.Config{Seed: 1, Pods: 66, ContainersPerPod: 7, ChurnPerStep: 6}, stepEvery: time.Second},
		{name: "slow-runtime", about: "every runtime call takes ~150 ms, stretching relists",
			cfg: sim.Config{Seed: 1, Pods: 30, ContainersPerPod: 3, ChurnPerStep: 5,
				Latency: sim.Latency{Base: 150 * time.Millisecond, Jitter: 20 * time.Millisecond}}, stepEvery: time.Second},
		{name: "hung-pod", about: "one pod whose status calls never answer, the classic cause of \"PLEG is not healthy\"",
			cfg: sim.Config{Seed: 1, Pods: 10, ContainersPerPod: 2, ChurnPerStep: 2, HangPods: 1}, stepEvery: 2 * time.Second},
	}
}

func scenarioNames() []string {
	var names []string
	for _, s := range demoScenarios() {
		names = append(names, s.name)
	}
	return names
}

func newDemoCmd() *cobra.Command {
	rf := &runtimeFlags{}
	lf := &listenFlags{}
	var scenario string
	var duration time.Duration
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the PLEG against a simulated node, with a live view",
		Long: `demo starts a simulated CRI runtime in-process on a private socket, runs the
pleg daemon against it (HTTP API included) and shows a live view: events as
they happen, relist latency, health and pod counts.

Scenarios (--scenario):
  idle          a node with no pods
  busy          66 pods x 7 containers created at once, then churning
  slow-runtime  every runtime call is slow, stretching relists
  hung-pod      one pod whose status calls never answer: the kubelet's
                relist would stall for the runtime request timeout and the
                node would go NotReady; pleg names the pod and stays healthy

--duration ends the demo on its own (for scripts); otherwise Ctrl-C.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd, rf, lf, scenario, duration)
		},
	}
	rf.addFlags(cmd.Flags())
	lf.addFlags(cmd.Flags())
	// The demo's runtime is its own simulated one.
	for _, n := range []string{"container-runtime-endpoint", "runtime-endpoint"} {
		_ = cmd.Flags().MarkHidden(n)
	}
	cmd.Flags().Var(newEnumValue(&scenario, "busy", scenarioNames()...), "scenario",
		"the simulated node: "+strings.Join(scenarioNames(), ", "))
	durationVar(cmd.Flags(), &duration, "duration", 0, 100*time.Millisecond, 24*time.Hour, "stop after this long (0: run until interrupted)",
		special[time.Duration]{0, "until interrupted"})
	return cmd
}

func runDemo(cmd *cobra.Command, rf *runtimeFlags, lf *listenFlags, scenario string, duration time.Duration) error {
	var sc demoScenario
	for _, s := range demoScenarios() {
		if s.name == scenario {
			sc = s
		}
	}
	dir, err := os.MkdirTemp("", "pleg-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	node := sim.New(sc.cfg)
	if err := node.Serve(filepath.Join(dir, "cri.sock")); err != nil {
		return fmt.Errorf("starting the simulated runtime: %w", err)
	}
	defer node.Stop()
	rf.endpoint = node.Endpoint()
	if err := rf.validate(); err != nil {
		return err
	}
	if err := lf.validate(); err != nil {
		return err
	}

	// Logs go to a file: the terminal belongs to the live view.
	logPath := filepath.Join(dir, "pleg.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	quietKlog(logFile)
	defer func() { klog.Flush(); klog.LogToStderr(true) }()

	sigCtx, stop := signalContext(cmd)
	defer stop()
	ctx, cancel := context.WithCancel(sigCtx)
	defer cancel()
	if duration > 0 {
		var c context.CancelFunc
		ctx, c = context.WithTimeout(ctx, duration)
		defer c()
	}

	d, err := newDaemon(rf, daemonOptions{withMetrics: true, withReadiness: true, nodeName: lf.nodeName})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", lf.address)
	if err != nil && lf.address == defaultListenAddress {
		ln, err = net.Listen("tcp", "127.0.0.1:0") // a daemon already has the default port
	}
	if err != nil {
		_ = d.client.Close()
		return fmt.Errorf("cannot listen on --listen-address %s: %w", lf.address, err)
	}
	srv := httpapi.New(lf.serverConfig(d))
	srv.Handle("/", dashboard.Handler())

	view := &demoView{scenario: sc, endpoint: node.Endpoint(), url: "http://" + ln.Addr().String(),
		logPath: logPath, gen: d.gen, ready: d.ready, node: node, start: time.Now(), out: cmd.OutOrStdout()}
	view.tty = isTerminal(cmd.OutOrStdout())

	d.start(ctx)
	sub := d.gen.Subscribe()
	d.spawn(func() { view.follow(ctx, sub) })
	if sc.stepEvery > 0 {
		node.Run(ctx, sc.stepEvery)
	}
	d.spawn(func() { view.loop(ctx) })
	serveErr := srv.Serve(ctx, ln)
	cancel()
	sub.Close()
	d.stop()
	view.final()
	if serveErr != nil {
		return fmt.Errorf("serving HTTP on %s: %w", ln.Addr(), serveErr)
	}
	return nil
}

// quietKlog sends every log line, errors included, to w only.
func quietKlog(w io.Writer) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("stderrthreshold", "FATAL")
	klog.LogToStderr(false)
	klog.SetOutput(w)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// demoView renders the live terminal view.
type demoView struct {
	scenario demoScenario
	endpoint string
	url      string
	logPath  string
	gen      *pleg.Generator
	ready    *pleg.Readiness
	node     *sim.Runtime
	start    time.Time
	out      io.Writer
	tty      bool

	mu     sync.Mutex
	recent []pleg.Event
	total  int
}

// follow reads every event; without a terminal it prints them as lines.
func (v *demoView) follow(ctx context.Context, sub *pleg.Subscription) {
	for {
		u, err := sub.Next(ctx)
		if err != nil {
			return
		}
		if u.Resync {
			continue
		}
		v.mu.Lock()
		v.total++
		v.recent = append(v.recent, u.Event)
		if len(v.recent) > 12 {
			v.recent = v.recent[len(v.recent)-12:]
		}
		v.mu.Unlock()
		if !v.tty {
			fmt.Fprintln(v.out, eventLine(u.Event))
		}
	}
}

func (v *demoView) loop(ctx context.Context) {
	every := 500 * time.Millisecond
	if !v.tty {
		every = 5 * time.Second
		fmt.Fprintf(v.out, "pleg demo: scenario %s (%s)\nruntime %s (simulated)\nhttp    %s/  logs %s\n",
			v.scenario.name, v.scenario.about, v.endpoint, v.url, v.logPath)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if v.tty {
			fmt.Fprint(v.out, "\x1b[H\x1b[2J"+v.render())
		} else {
			fmt.Fprintln(v.out, "status: "+v.summary())
		}
	}
}

func eventLine(e pleg.Event) string {
	name := e.ContainerName
	if e.Sandbox {
		name = "(sandbox)"
	}
	exit := ""
	if e.ExitCode != nil {
		exit = fmt.Sprintf("exit %d", *e.ExitCode)
	}
	return fmt.Sprintf("%s  %-16s %-36s %-14s %-13s %s", e.Time.Format("15:04:05.000"), e.Type,
		e.Pod(), name, textfmt.ShortID(e.ContainerID), exit)
}

// relistSummary returns the count, p50, p99 and max of recent successful
// relists.
func relistSummary(recent []pleg.RelistStat) (n int, p50, p99, max time.Duration) {
	var ds []time.Duration
	for _, s := range recent {
		if s.Err == "" {
			ds = append(ds, s.Duration)
		}
	}
	return len(ds), stats.Percentile(ds, .5), stats.Percentile(ds, .99), stats.Percentile(ds, 1)
}

func (v *demoView) health() string {
	if ok, err := v.gen.Healthy(); !ok {
		return "PLEG is not healthy: " + err.Error()
	}
	return "ok"
}

func (v *demoView) summary() string {
	stats := v.gen.RecentRelists()
	n, p50, p99, _ := relistSummary(stats)
	v.mu.Lock()
	total := v.total
	v.mu.Unlock()
	pods := 0
	if len(stats) > 0 {
		pods = stats[len(stats)-1].Pods
	}
	return fmt.Sprintf("health=%q relists=%d p50=%v p99=%v pods=%d events=%d slow=%d",
		v.health(), n, p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond), pods, total, len(v.slowPods()))
}

// slowPods lists the cached inspection timeouts.
func (v *demoView) slowPods() []string {
	var out []string
	for _, e := range v.gen.Cache().List() {
		var te *pleg.InspectionTimeoutError
		if errors.As(e.Err, &te) {
			out = append(out, te.Error())
		}
	}
	return out
}

func (v *demoView) render() string {
	var b strings.Builder
	stats := v.gen.RecentRelists()
	n, p50, p99, max := relistSummary(stats)
	fmt.Fprintf(&b, "pleg demo — scenario %s: %s   (%s, Ctrl-C to stop)\n\n", v.scenario.name, v.scenario.about,
		time.Since(v.start).Round(time.Second))
	fmt.Fprintf(&b, "runtime   %s (simulated)\n", v.endpoint)
	fmt.Fprintf(&b, "http      %s/  (/healthz /readyz /metrics /api/v1/pods /api/v1/events)\n", v.url)
	fmt.Fprintf(&b, "logs      %s\n\n", v.logPath)
	fmt.Fprintf(&b, "health    %s\n", v.health())
	if v.ready != nil {
		c := v.ready.Condition()
		fmt.Fprintf(&b, "ready     %s (%s) %s\n", c.Status, c.Reason, c.Message)
	}
	running := ""
	if d := v.gen.RelistRunningFor(); d > 0 {
		running = fmt.Sprintf("   relist running for %v", d.Round(time.Millisecond))
	}
	fmt.Fprintf(&b, "relists   %d ok   p50 %v   p99 %v   max %v%s\n", n, p50.Round(10*time.Microsecond),
		p99.Round(10*time.Microsecond), max.Round(10*time.Microsecond), running)
	if len(stats) > 0 {
		s := stats[len(stats)-1]
		fmt.Fprintf(&b, "last      %d pods, %d containers and sandboxes; %d inspected (%d failed, %d timed out), %d events\n",
			s.Pods, s.Containers, s.Inspected, s.Failed, s.TimedOut, s.Events)
	}
	es := v.gen.EventStream()
	fmt.Fprintf(&b, "runtime events  %s (%d received)\n", es.State, es.Events)
	if slow := v.slowPods(); len(slow) > 0 {
		b.WriteString("\nslow pods\n")
		for _, s := range slow {
			b.WriteString("  " + s + "\n")
		}
	}
	v.mu.Lock()
	fmt.Fprintf(&b, "\nevents (%d delivered)\n", v.total)
	for _, e := range v.recent {
		b.WriteString("  " + eventLine(e) + "\n")
	}
	v.mu.Unlock()
	return b.String()
}

// final prints a one-line summary when the demo ends.
func (v *demoView) final() {
	fmt.Fprintf(v.out, "demo finished: scenario=%s %s\n", v.scenario.name, v.summary())
}
