package main

import (
	"context"
	"fmt"
	"net"
	"os"
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
	socket       string
	socketMode   string
	socketGroup  string
	tcpAddress   string
	allowedUIDs  []uint
	allowedGIDs  []uint
	stallTimeout time.Duration
	maxWatchers  int

	journalSize     int
	journalMaxAge   time.Duration
	journalMaxBytes int
	bookmark        time.Duration

	// Set by validate.
	mode os.FileMode
	gid  int
}

func (f *lifecycleFlags) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.socket, "lifecycle-socket", server.DefaultSocketPath,
		"unix socket to serve the lifecycle API (gRPC, docs/stream.md) on; its directory is created (empty: none)")
	fs.StringVar(&f.socketMode, "lifecycle-socket-mode", fmt.Sprintf("%04o", server.DefaultSocketMode),
		"file mode of the lifecycle socket, octal: who may connect (the owner is pleg's user)")
	fs.StringVar(&f.socketGroup, "lifecycle-socket-group", "",
		"group (name or GID) of the lifecycle socket, e.g. the agents' group with mode 0660 (empty: pleg's group)")
	fs.StringVar(&f.tcpAddress, "lifecycle-tcp-address", "",
		"loopback host:port to also serve the lifecycle API on, without access control (empty: none; port 0 picks one)")
	fs.UintSliceVar(&f.allowedUIDs, "lifecycle-allowed-uids", nil,
		"UIDs allowed on the lifecycle socket besides its mode (peer credentials; with --lifecycle-allowed-gids: either matches; empty: any)")
	fs.UintSliceVar(&f.allowedGIDs, "lifecycle-allowed-gids", nil,
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
	var err error
	if f.mode, err = socketMode("lifecycle-socket-mode", f.socketMode); err != nil {
		return err
	}
	f.gid = -1
	if f.socketGroup != "" {
		if f.gid, err = lookupGroup(f.socketGroup); err != nil {
			return usageErrorf("invalid --lifecycle-socket-group %q: %v", f.socketGroup, err)
		}
	}
	if f.tcpAddress != "" {
		if err := validateAddress("lifecycle-tcp-address", f.tcpAddress); err != nil {
			return err
		}
		if !loopbackOnly(f.tcpAddress) {
			return usageErrorf("invalid --lifecycle-tcp-address %q: must be on loopback (127.0.0.1, ::1 or localhost): TCP has no access control", f.tcpAddress)
		}
		if len(f.allowedUIDs) > 0 || len(f.allowedGIDs) > 0 {
			return usageErrorf("--lifecycle-tcp-address cannot be combined with --lifecycle-allowed-uids/gids: TCP peers carry no credentials to check")
		}
	}
	for _, l := range []struct {
		name string
		ids  []uint
	}{{"uids", f.allowedUIDs}, {"gids", f.allowedGIDs}} {
		for _, id := range l.ids {
			if id > 1<<32-1 {
				return usageErrorf("invalid --lifecycle-allowed-%s %d: too large", l.name, id)
			}
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

func toUint32s(ids []uint) []uint32 {
	out := make([]uint32, len(ids))
	for i, id := range ids {
		out[i] = uint32(id)
	}
	return out
}

// lifecycleAPI is the lifecycle server and its listeners.
type lifecycleAPI struct {
	srv *server.Server
	lns []net.Listener
}

// listen makes the lifecycle server of d's journal and opens its
// listeners; nil when no listener is configured.
func (f *lifecycleFlags) listen(d *daemon) (*lifecycleAPI, error) {
	if f.socket == "" && f.tcpAddress == "" {
		return nil, nil
	}
	srv, err := server.New(server.Config{
		Journal:      d.gen.Journal(),
		Logger:       d.log.WithName("lifecycle"),
		Registerer:   d.reg,
		StallTimeout: f.stallTimeout,
		MaxWatchers:  f.maxWatchers,
		Access:       server.Access{AllowedUIDs: toUint32s(f.allowedUIDs), AllowedGIDs: toUint32s(f.allowedGIDs)},
	})
	if err != nil {
		return nil, err
	}
	api := &lifecycleAPI{srv: srv}
	if f.socket != "" {
		ln, err := server.ListenUnix(f.socket, f.mode, f.gid)
		if err != nil {
			return nil, fmt.Errorf("cannot listen on --lifecycle-socket %s: %w (set --lifecycle-socket to another path, or to \"\" for none)", f.socket, err)
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
