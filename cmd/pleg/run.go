package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/podlifecycle/pleg/internal/app/dashboard"
	"github.com/podlifecycle/pleg/internal/app/httpapi"
)

func init() { register(newRunCmd) }

func newRunCmd() *cobra.Command {
	rf := &runtimeFlags{}
	lf := &listenFlags{}
	cf := &lifecycleFlags{}
	crf := &criFlags{}
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the PLEG as a daemon with health, metrics and an HTTP API",
		Long: `run relists the CRI runtime's pods and containers every --relist-period,
keeps the pod status cache fresh and serves on --listen-address:

  GET /healthz         200 "ok", or 500 "PLEG is not healthy: <reason>"
  GET /readyz          the node Ready condition as JSON (200 True, 503 False)
  GET /metrics         Prometheus metrics with the kubelet's names
  GET /api/v1/pods     the pod status cache as JSON
  GET /api/v1/events   the lifecycle stream as Server-Sent Events (docs/stream.md)
  GET /api/v1/relists  the recent relists (durations, pods inspected)
  GET /                a live dashboard

and the lifecycle API (gRPC, api/lifecycle/v1/lifecycle.proto; docs/stream.md)
on --lifecycle-socket (default /run/pleg/pleg.sock, mode 0660): every pod as
a snapshot, then every event, resumable by cursor from a journal of
--journal-size events; ListPods, GetPod, GetContainer; gRPC health. The
socket's mode and group (--lifecycle-socket-mode, --lifecycle-socket-group)
decide who may connect; every client's UID, GID and PID are logged and can
be restricted (--lifecycle-allowed-uids, --lifecycle-allowed-gids).
--lifecycle-tcp-address also serves it on loopback TCP.

--cri-socket serves the CRI (runtime.v1 RuntimeService and ImageService)
read-only for agents that speak CRI (docs/cri.md): listings, statuses,
Status and GetContainerEvents from pleg's state with no runtime call;
verbose ContainerStatus from pleg's relist, whose ContainerStatus calls are
then verbose; verbose PodSandboxStatus, images and stats passed through,
bounded
(--cri-max-in-flight, --cri-pass-through-rate, --runtime-request-timeout);
every call that creates, changes, removes, execs, attaches or forwards
refused (PermissionDenied). Its mode, group and allowed peers are set as the
lifecycle socket's. --cri-pod-socket serves the same for one pod: a caller
sees only the pod its process runs in, and nothing when it is in none.

--listen-address should stay on loopback (the default): the pod API and the
dashboard show pod names, IPs and errors without authentication.
--metrics-address serves only /healthz, /readyz and /metrics, for
Prometheus and the kubelet's probes on the node's address.

--listen-address answers only requests whose Host is a loopback address or
localhost (or one of --allowed-hosts), so that a web page cannot read it
through DNS rebinding. Each listener serves at most --max-connections
connections, and drops an event stream whose client has taken nothing for
10s or has more than 256 KiB waiting.

A runtime that is down at start or restarts later is retried on every relist
forever; /healthz and /readyz say why meanwhile. With -v=2 every event is
logged as the kubelet does ("SyncLoop (PLEG): event for pod").
SIGINT or SIGTERM stops it gracefully with exit code 0.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runDaemon(cmd, rf, lf, cf, crf) },
	}
	rf.addFlags(cmd.Flags())
	lf.addFlags(cmd.Flags())
	cf.addFlags(cmd.Flags())
	crf.addFlags(cmd.Flags())
	return cmd
}

// daemonGCPercent is the daemon's garbage collector target unless GOGC
// says otherwise: a node agent's memory is what it keeps (pod statuses, the
// listing), and at steady state it allocates almost nothing, so a heap goal
// of 1.25x the live heap instead of Go's 2x costs no CPU that `pleg bench`
// can tell apart, and 2 MiB of the peak at 1,000 x 10 against 1.5x
// (README, "Performance"). pleg bench runs pleg's generator with it too.
const daemonGCPercent = 25

// setDaemonGC sets the daemon's garbage collector target, unless GOGC is
// set.
func setDaemonGC() {
	if _, ok := os.LookupEnv("GOGC"); !ok {
		debug.SetGCPercent(daemonGCPercent)
	}
}

func runDaemon(cmd *cobra.Command, rf *runtimeFlags, lf *listenFlags, cf *lifecycleFlags, crf *criFlags) error {
	if err := rf.validate(); err != nil {
		return err
	}
	if err := lf.validate(); err != nil {
		return err
	}
	if err := cf.validate(); err != nil {
		return err
	}
	if err := crf.validate(); err != nil {
		return err
	}
	setDaemonGC()
	sigCtx, stop := signalContext(cmd)
	defer stop()
	// ctx also ends when serving fails, stopping everything else.
	ctx, cancel := context.WithCancel(sigCtx)
	defer cancel()

	dopts := daemonOptions{withMetrics: true, withReadiness: true, nodeName: lf.nodeName, journal: cf.journalOptions()}
	// With a CRI endpoint, pleg's own ContainerStatus calls are verbose
	// and kept, so that its clients' verbose ContainerStatus calls cost
	// the runtime nothing more (docs/cri.md).
	verbose := crf.verboseStore()
	if verbose != nil {
		dopts.verbose = verbose
	}
	d, err := newDaemon(rf, dopts)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", lf.address)
	if err != nil {
		_ = d.client.Close()
		return fmt.Errorf("cannot listen on --listen-address %s: %w", lf.address, err)
	}
	var public net.Listener
	if lf.metricsAddress != "" {
		if public, err = net.Listen("tcp", lf.metricsAddress); err != nil {
			ln.Close()
			_ = d.client.Close()
			return fmt.Errorf("cannot listen on --metrics-address %s: %w", lf.metricsAddress, err)
		}
	}
	lapi, err := cf.listen(d)
	if err != nil {
		ln.Close()
		if public != nil {
			public.Close()
		}
		_ = d.client.Close()
		return err
	}
	capi, err := crf.listen(d, rf, cf, verbose)
	if err != nil {
		ln.Close()
		if public != nil {
			public.Close()
		}
		if lapi != nil {
			lapi.close()
		}
		_ = d.client.Close()
		return err
	}
	if !loopbackOnly(lf.address) {
		d.log.Info("WARNING: --listen-address is not loopback: the pod API (/api/v1/) and the dashboard, which show pod names, IPs and errors, are served without authentication; keep it on 127.0.0.1 and use --metrics-address for Prometheus and probes (it answers only loopback Host headers unless --allowed-hosts names others)",
			"listenAddress", lf.address)
	}
	srv := httpapi.New(lf.serverConfig(d))
	srv.Handle("/", dashboard.Handler())
	// The one startup line; tests and scripts read the URL from it (the
	// port is only known here when --listen-address has port 0).
	d.log.Info("listening on http://"+ln.Addr().String(), "endpoint", rf.endpoint,
		"listenAddress", lf.address, "node", lf.nodeName, "relistPeriod", rf.relistPeriod,
		"relistThreshold", rf.relistThreshold, "events", rf.events)

	d.start(ctx)
	d.spawn(func() { d.logRuntimeVersion(ctx, rf.dialTimeout()) })
	d.spawn(func() { d.probeStuckRuntime(ctx, rf.endpoint) })
	if lapi != nil {
		lapi.serve(ctx, d, cancel)
	}
	if capi != nil {
		capi.serve(ctx, d, cancel)
	}

	if public != nil {
		d.log.Info("serving /healthz, /readyz and /metrics on http://"+public.Addr().String(), "metricsAddress", lf.metricsAddress)
		d.spawn(func() {
			if err := srv.ServePublic(ctx, public); err != nil {
				d.log.Error(err, "Serving --metrics-address failed; stopping", "metricsAddress", lf.metricsAddress)
				cancel()
			}
		})
	}
	serveErr := srv.Serve(ctx, ln)
	cancel()
	d.stop()
	if serveErr != nil {
		return fmt.Errorf("serving HTTP on %s: %w", ln.Addr(), serveErr)
	}
	d.log.Info("Stopped")
	return nil
}
