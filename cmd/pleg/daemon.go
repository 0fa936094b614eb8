package main

import (
	"context"
	"errors"
	"fmt"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/cruntime/cri"
	"github.com/podlifecycle/pleg/journal"
	"github.com/podlifecycle/pleg/metrics"
)

// daemon is the wiring shared by the commands that run a generator against
// a CRI runtime: logger, metrics, CRI client, generator and, for serving
// commands, the Ready condition aggregator.
type daemon struct {
	log     logr.Logger
	reg     *prometheus.Registry // nil unless withMetrics
	metrics *metrics.Metrics
	client  *cri.Client
	gen     *pleg.Generator
	ready   *pleg.Readiness // nil unless withReadiness

	wg sync.WaitGroup
}

type daemonOptions struct {
	// withMetrics registers every collector (the generator's, the Go
	// runtime's and the process's) on a fresh registry.
	withMetrics bool
	// withReadiness runs the Ready condition aggregator (periodic CRI
	// Status calls).
	withReadiness bool
	// nodeName sets the kubelet_node_name{node} info gauge.
	nodeName string
	// journal configures the generator's journal (zero: defaults).
	journal journal.Options
	// verbose, if set, makes the generator's status calls verbose and
	// receives their answers (the CRI endpoint's store, docs/cri.md).
	verbose cri.VerboseSink
}

// newDaemon builds everything; it does no I/O (the CRI connection is made
// by the first call). Flags must be validated already.
func newDaemon(rf *runtimeFlags, o daemonOptions) (*daemon, error) {
	d := &daemon{log: klog.Background()}
	var reg prometheus.Registerer
	if o.withMetrics {
		d.reg = prometheus.NewRegistry()
		d.reg.MustRegister(
			collectors.NewGoCollector(),
			collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		)
		reg = d.reg
	}
	d.metrics = metrics.New(reg)
	if o.nodeName != "" {
		d.metrics.NodeName.WithLabelValues(o.nodeName).Set(1)
	}
	copts := []cri.Option{
		cri.WithTimeout(rf.requestTimeout),
		cri.WithMetrics(d.metrics),
		cri.WithLogger(d.log.WithName("cri")),
		cri.WithListStreaming(rf.listStreamingMode()),
		cri.WithDirectLists(rf.directLists),
	}
	if o.verbose != nil {
		copts = append(copts, cri.WithVerboseStatuses(o.verbose))
	}
	client, err := cri.Dial(rf.endpoint, copts...)
	if err != nil {
		return nil, usageErrorf("invalid --container-runtime-endpoint %q: %v", rf.endpoint, endpointReason(err))
	}
	d.client = client
	opts := rf.generatorOptions()
	opts.Runtime = client
	opts.Logger = d.log
	opts.Metrics = d.metrics
	opts.Journal = o.journal
	d.gen, err = pleg.New(opts)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	if o.withReadiness {
		d.ready = pleg.NewReadiness(d.gen, pleg.ReadinessOptions{
			Runtime: client,
			Timeout: rf.requestTimeout,
			Logger:  d.log,
		})
	}
	return d, nil
}

// start starts the generator and, if any, the readiness checks, which run
// until ctx ends.
func (d *daemon) start(ctx context.Context) {
	d.gen.Start()
	if d.ready != nil {
		d.spawn(func() { d.ready.Run(ctx) })
	}
}

// stop stops the generator (closing every subscription), waits for the
// readiness checks (their ctx must be done) and closes the CRI connection.
func (d *daemon) stop() {
	d.gen.Stop()
	d.wg.Wait()
	_ = d.client.Close()
}

// signalContext returns a context cancelled by SIGINT or SIGTERM. After the
// first signal the default handling is restored, so a second one kills the
// process at once.
func signalContext(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	parent := cmd.Context()
	if parent == nil {
		parent = context.Background()
	}
	ctx, stop := signal.NotifyContext(parent, syscall.SIGINT, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	return ctx, stop
}

// reachError is the one-line error of a runtime that cannot be reached at
// start within timeout.
func reachError(endpoint string, timeout time.Duration, err error) error {
	cause := cri.Cause(err)
	if errors.Is(err, context.DeadlineExceeded) {
		cause = fmt.Sprintf("no answer within %v", timeout)
	}
	return fmt.Errorf("cannot reach the container runtime at %s: %s", endpoint, cause)
}

// spawn runs f on a goroutine that stop waits for; f must return once the
// context given to start ends.
func (d *daemon) spawn(f func()) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		f()
	}()
}

// logRuntimeVersion logs which runtime answers at the endpoint, or that
// none does yet (the relists keep retrying either way).
func (d *daemon) logRuntimeVersion(ctx context.Context, timeout time.Duration) {
	vctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	name, version, err := d.client.Version(vctx)
	switch {
	case ctx.Err() != nil:
	case err != nil:
		d.log.Info("The container runtime is not reachable yet; relisting keeps retrying",
			"endpoint", d.client.Endpoint(), "err", cri.Cause(err))
	default:
		d.log.Info("Connected to the container runtime", "endpoint", d.client.Endpoint(),
			"runtimeName", name, "runtimeVersion", version)
	}
}
