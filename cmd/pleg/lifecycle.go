package main

import (
	"context"
	"fmt"
	"net"
	"os/user"
	"strconv"
	"time"

	"github.com/spf13/pflag"

	"github.com/podlifecycle/pleg/api/lifecycle/server"
	"github.com/podlifecycle/pleg/journal"
)

// lifecycleFlags are pleg run's flags of the lifecycle API (gRPC on a unix
// socket, optionally loopback TCP) and of the journal it serves.
type lifecycleFlags struct {
	sock         socketFlags
	tcpAddress   string
	stallTimeout time.Duration
	maxWatchers  int

	journalSize     int
	journalMaxAge   time.Duration
	journalMaxBytes int
	bookmark        time.Duration
}

func (f *lifecycleFlags) addFlags(fs *pflag.FlagSet) {
	f.sock.name, f.sock.peers = "lifecycle-socket", "lifecycle-allowed"
	fs.StringVar(&f.sock.path, "lifecycle-socket", server.DefaultSocketPath,
		"unix socket to serve the lifecycle API (gRPC, docs/stream.md) on; its directory is created (empty: none)")
	fs.StringVar(&f.sock.modeValue, "lifecycle-socket-mode", fmt.Sprintf("%04o", server.DefaultSocketMode),
		"file mode of the lifecycle socket, octal: who may connect (the owner is pleg's user)")
	fs.StringVar(&f.sock.group, "lifecycle-socket-group", "",
		"group (name or GID) of the lifecycle socket, e.g. the agents' group with mode 0660 (empty: pleg's group)")
	fs.StringVar(&f.tcpAddress, "lifecycle-tcp-address", "",
		"loopback host:port to also serve the lifecycle API on, without access control (empty: none; port 0 picks one)")
	fs.UintSliceVar(&f.sock.allowedUIDs, "lifecycle-allowed-uids", nil,
		"UIDs allowed on the lifecycle socket besides its mode (peer credentials; with --lifecycle-allowed-gids: either matches; empty: any)")
	fs.UintSliceVar(&f.sock.allowedGIDs, "lifecycle-allowed-gids", nil,
		"primary GIDs allowed on the lifecycle socket besides its mode (see --lifecycle-allowed-uids)")
	durationVar(fs, &f.stallTimeout, "lifecycle-stall-timeout", server.DefaultStallTimeout, time.Second, time.Hour,
		"a watcher that reads nothing for this long while messages wait is cut (it resumes by its cursor)")
	intVar(fs, &f.maxWatchers, "lifecycle-max-watchers", server.DefaultMaxWatchers, 1, 1<<20,
		"watches served at once; more are refused (ResourceExhausted)")
	intVar(fs, &f.journalSize, "journal-size", journal.DefaultSize, 1, 1<<20,
		"lifecycle events the journal keeps for watchers to resume from")
	durationVar(fs, &f.journalMaxAge, "journal-max-age", journal.DefaultMaxAge, time.Second, 24*time.Hour,
		"how long the journal keeps an event, and a removed container for lookups")
	intVar(fs, &f.journalMaxBytes, "journal-max-bytes", journal.DefaultMaxBytes, 1<<16, 1<<30,
		"memory the journal's events may take (estimated), and as much for removed containers kept for lookups; the oldest go first")
	durationVar(fs, &f.bookmark, "lifecycle-bookmark-interval", journal.DefaultBookmarkInterval, 100*time.Millisecond, time.Hour,
		"an idle watcher gets a bookmark (its cursor moved on) after this long")
}

func (f *lifecycleFlags) validate() error {
	if err := f.sock.validate(); err != nil {
		return err
	}
	if f.tcpAddress != "" {
		if err := validateAddress("lifecycle-tcp-address", f.tcpAddress); err != nil {
			return err
		}
		if !loopbackOnly(f.tcpAddress) {
			return usageErrorf("invalid --lifecycle-tcp-address %q: must be on loopback (127.0.0.1, ::1 or localhost): TCP has no access control", f.tcpAddress)
		}
		if len(f.sock.allowedUIDs) > 0 || len(f.sock.allowedGIDs) > 0 {
			return usageErrorf("--lifecycle-tcp-address cannot be combined with --lifecycle-allowed-uids/gids: TCP peers carry no credentials to check")
		}
	}
	return nil
}

// lookupGroup resolves a group name or numeric GID.
func lookupGroup(g string) (int, error) {
	if n, err := strconv.ParseUint(g, 10, 31); err == nil {
		return int(n), nil
	}
	gr, err := user.LookupGroup(g)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(gr.Gid)
}

// journalOptions are the journal's options the flags set.
func (f *lifecycleFlags) journalOptions() journal.Options {
	return journal.Options{Size: f.journalSize, MaxAge: f.journalMaxAge, MaxBytes: f.journalMaxBytes, BookmarkInterval: f.bookmark}
}

// lifecycleAPI is the lifecycle server and its listeners.
type lifecycleAPI struct {
	srv *server.Server
	lns []net.Listener
}

// listen makes the lifecycle server of d's journal and opens its
// listeners; nil when no listener is configured.
func (f *lifecycleFlags) listen(d *daemon) (*lifecycleAPI, error) {
	if f.sock.path == "" && f.tcpAddress == "" {
		return nil, nil
	}
	srv, err := server.New(server.Config{
		Journal:      d.gen.Journal(),
		Logger:       d.log.WithName("lifecycle"),
		Registerer:   d.reg,
		StallTimeout: f.stallTimeout,
		MaxWatchers:  f.maxWatchers,
		Access:       f.sock.access(),
	})
	if err != nil {
		return nil, err
	}
	api := &lifecycleAPI{srv: srv}
	if f.sock.path != "" {
		ln, err := f.sock.listen()
		if err != nil {
			return nil, err
		}
		api.lns = append(api.lns, ln)
	}
	if f.tcpAddress != "" {
		ln, err := net.Listen("tcp", f.tcpAddress)
		if err != nil {
			api.close()
			return nil, fmt.Errorf("cannot listen on --lifecycle-tcp-address %s: %w", f.tcpAddress, err)
		}
		api.lns = append(api.lns, ln)
	}
	return api, nil
}

// close closes the listeners (when serving never started).
func (a *lifecycleAPI) close() {
	for _, ln := range a.lns {
		ln.Close()
	}
}

// serve serves until ctx ends; cancel is called if serving fails.
func (a *lifecycleAPI) serve(ctx context.Context, d *daemon, cancel context.CancelFunc) {
	for _, ln := range a.lns {
		url := "unix://" + ln.Addr().String()
		if ln.Addr().Network() == "tcp" {
			url = ln.Addr().String()
		}
		d.log.Info("serving the lifecycle API (gRPC) on " + url)
	}
	d.spawn(func() {
		if err := a.srv.Serve(ctx, a.lns...); err != nil {
			d.log.Error(err, "Serving the lifecycle API failed; stopping")
			cancel()
		}
	})
}
