package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/podlifecycle/pleg/api/lifecycle/server"
	"github.com/podlifecycle/pleg/criserve"
)

// criFlags are pleg run's flags of its read-only CRI endpoint (docs/cri.md).
type criFlags struct {
	sock        socketFlags // --cri-socket
	podSock     socketFlags // --cri-pod-socket (no group, no allowed peers)
	maxInFlight int
	rate        float64
	burst       int
	maxStreams  int
}

func (f *criFlags) addFlags(fs *pflag.FlagSet) {
	f.sock.name, f.sock.peers = "cri-socket", "cri-allowed"
	f.podSock.name = "cri-pod-socket"
	fs.StringVar(&f.sock.path, "cri-socket", "",
		"unix socket to serve a read-only CRI (runtime.v1) on, from pleg's state, for agents that speak CRI (docs/cri.md; empty: none)")
	fs.StringVar(&f.sock.modeValue, "cri-socket-mode", fmt.Sprintf("%04o", server.DefaultSocketMode),
		"file mode of --cri-socket, octal: who may connect (the owner is pleg's user)")
	fs.StringVar(&f.sock.group, "cri-socket-group", "",
		"group (name or GID) of --cri-socket (empty: pleg's group)")
	fs.UintSliceVar(&f.sock.allowedUIDs, "cri-allowed-uids", nil,
		"UIDs allowed on --cri-socket besides its mode (peer credentials; with --cri-allowed-gids: either matches; empty: any)")
	fs.UintSliceVar(&f.sock.allowedGIDs, "cri-allowed-gids", nil,
		"primary GIDs allowed on --cri-socket besides its mode (see --cri-allowed-uids)")
	fs.StringVar(&f.podSock.path, "cri-pod-socket", "",
		"unix socket to serve a pod-scoped read-only CRI on: a caller sees only the pod its process runs in, found from its peer credentials (PID -> cgroup -> pod), and nothing when it is in none (empty: none)")
	fs.StringVar(&f.podSock.modeValue, "cri-pod-socket-mode", "0666",
		"file mode of --cri-pod-socket, octal (pods run as any UID; what a caller sees is its own pod)")
	intVar(fs, &f.maxInFlight, "cri-max-in-flight", criserve.DefaultMaxInFlight, 1, 256,
		"calls the CRI endpoints pass through to the runtime at once (verbose statuses, images, stats); more wait, within --runtime-request-timeout")
	floatVar(fs, &f.rate, "cri-pass-through-rate", criserve.DefaultRate, 0.1, 10000,
		"calls a second the CRI endpoints pass through to the runtime; a call that would wait past its timeout is refused (ResourceExhausted)")
	intVar(fs, &f.burst, "cri-pass-through-burst", criserve.DefaultBurst, 1, 100000,
		"calls the CRI endpoints may pass through at once before --cri-pass-through-rate applies")
	intVar(fs, &f.maxStreams, "cri-max-event-streams", criserve.DefaultMaxStreams, 1, 1<<16,
		"GetContainerEvents streams each CRI endpoint serves at once; more are refused (ResourceExhausted)")
}

// socketMode parses an octal socket mode flag.
func socketMode(flag, value string) (os.FileMode, error) {
	mode, err := strconv.ParseUint(value, 8, 32)
	if err != nil || mode > 0o777 {
		return 0, usageErrorf("invalid --%s %q: want octal permissions such as 0660", flag, value)
	}
	return os.FileMode(mode), nil
}

func (f *criFlags) validate() error {
	if err := f.sock.validate(); err != nil {
		return err
	}
	if err := f.podSock.validate(); err != nil {
		return err
	}
	if f.sock.path != "" && f.sock.path == f.podSock.path {
		return usageErrorf("--cri-socket and --cri-pod-socket are the same path %q: give each its own", f.sock.path)
	}
	return nil
}

// criAPI is the CRI endpoints' servers and listeners.
type criAPI struct {
	srvs  []*criserve.Server
	lns   []net.Listener
	names []string
}

// verboseStore returns the store of the verbose statuses pleg's relisting
// gets for the CRI endpoints to answer from; nil when none is configured.
func (f *criFlags) verboseStore() *criserve.VerboseStore {
	if f.sock.path == "" && f.podSock.path == "" {
		return nil
	}
	return criserve.NewVerboseStore(criserve.DefaultVerboseStoreBytes)
}

// listen makes the CRI servers of d and opens their sockets, answering
// verbose statuses from verbose (nil: pass them through); nil when none
// is configured.
func (f *criFlags) listen(d *daemon, rf *runtimeFlags, cf *lifecycleFlags, verbose *criserve.VerboseStore) (*criAPI, error) {
	if f.sock.path == "" && f.podSock.path == "" {
		return nil, nil
	}
	api := &criAPI{}
	var reg prometheus.Registerer
	if d.reg != nil {
		reg = d.reg
	}
	m, err := criserve.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	base := criserve.Config{
		Metrics:      m,
		Journal:      d.gen.Journal(),
		Runtime:      d.client.RuntimeService(),
		Images:       d.client.ImageService(),
		Timeout:      rf.requestTimeout,
		MaxInFlight:  f.maxInFlight,
		Rate:         f.rate,
		Burst:        f.burst,
		StallTimeout: cf.stallTimeout,
		MaxStreams:   f.maxStreams,
		Verbose:      verbose,
	}
	if d.ready != nil {
		base.Conditions = d.ready
	}
	add := func(s *socketFlags, cfg criserve.Config) error {
		cfg.Flag = "--" + s.name
		cfg.Logger = d.log.WithName("cri-endpoint").WithValues("socket", s.path)
		cfg.Access = s.access()
		srv, err := criserve.New(cfg)
		if err != nil {
			return err
		}
		ln, err := s.listen()
		if err != nil {
			return err
		}
		api.srvs, api.lns, api.names = append(api.srvs, srv), append(api.lns, ln), append(api.names, s.name)
		return nil
	}
	if f.sock.path != "" {
		if err := add(&f.sock, base); err != nil {
			api.close()
			return nil, err
		}
	}
	if f.podSock.path != "" {
		cfg := base
		cfg.Scope = criserve.ProcScope{}
		if err := add(&f.podSock, cfg); err != nil {
			api.close()
			return nil, err
		}
	}
	return api, nil
}

// close closes the listeners (when serving never started).
func (a *criAPI) close() {
	for _, ln := range a.lns {
		ln.Close()
	}
}

// serve serves until ctx ends; cancel is called if serving fails.
func (a *criAPI) serve(ctx context.Context, d *daemon, cancel context.CancelFunc) {
	for i, srv := range a.srvs {
		ln, name := a.lns[i], a.names[i]
		d.log.Info("serving a read-only CRI endpoint on unix://"+ln.Addr().String(), "flag", "--"+name)
		d.spawn(func() {
			if err := srv.Serve(ctx, ln); err != nil {
				d.log.Error(err, "Serving the CRI endpoint failed; stopping", "flag", "--"+name)
				cancel()
			}
		})
	}
}
