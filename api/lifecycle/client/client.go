// Package client watches a node's pod lifecycle stream from pleg's
// Lifecycle API (api/lifecycle/v1) so that an agent writes only its
// handler: Run connects (unix socket or loopback TCP), hands the handler
// the snapshot of every pod, then every event, and on its own reconnects
// with backoff, resumes from the last cursor (no gap, no duplicate) and,
// when pleg answers that the cursor cannot be resumed from (pleg
// restarted, or the cursor fell out of its journal), watches again from a
// fresh snapshot and hands the handler that (OnResync), as client-go's
// reflector relists on 410 Gone.
//
//	c, err := client.New(client.Options{Address: "/run/pleg/pleg.sock"})
//	if err != nil { ... }
//	defer c.Close()
//	err = c.Run(ctx, client.HandlerFuncs{
//		Resync: func(pods []*lifecyclev1.Pod, at client.Position) { /* replace the view */ },
//		Event:  func(ev *lifecyclev1.PodEvent, at client.Position) { /* apply ev.Pod */ },
//	})
//
// The handler is called from Run's goroutine, one call at a time, in the
// stream's order. A handler that blocks holds the stream: pleg cuts a
// watcher that reads nothing for its stall timeout (10 s by default), and
// Run then resumes from the last message handled, so a slow handler loses
// nothing but costs a reconnection. docs/stream.md states the contract.
package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
)

// DefaultAddress is pleg run's default unix socket.
const DefaultAddress = "/run/pleg/pleg.sock"

// Defaults of Options.
const (
	DefaultInitialBackoff = 100 * time.Millisecond
	DefaultMaxBackoff     = 10 * time.Second
)

// Position is where a message is in the stream: the cursor to resume
// after it, and when pleg observed what it says.
type Position struct {
	Cursor string
	Time   time.Time
}

// Handler receives the stream. Every call is made from Run's goroutine,
// one at a time, in order.
type Handler interface {
	// OnResync gives every pod the filter selects now: the handler
	// replaces everything it knew with them. It is the first call, and
	// comes again after each resync (pleg restarted, or the cursor fell
	// out of its journal); events follow from at.Cursor.
	OnResync(pods []*lifecyclev1.Pod, at Position)
	// OnEvent gives a pod's change: ev.Pod is its full state after it
	// (ev.Pod.Gone: the pod is gone), ev.Transitions what happened.
	OnEvent(ev *lifecyclev1.PodEvent, at Position)
	// OnRuntimeStatus gives a change of the container runtime's status.
	OnRuntimeStatus(st *lifecyclev1.RuntimeStatus, at Position)
}

// HandlerFuncs is a Handler of functions; a nil one is not called.
type HandlerFuncs struct {
	Resync        func(pods []*lifecyclev1.Pod, at Position)
	Event         func(ev *lifecyclev1.PodEvent, at Position)
	RuntimeStatus func(st *lifecyclev1.RuntimeStatus, at Position)
}

func (h HandlerFuncs) OnResync(pods []*lifecyclev1.Pod, at Position) {
	if h.Resync != nil {
		h.Resync(pods, at)
	}
}

func (h HandlerFuncs) OnEvent(ev *lifecyclev1.PodEvent, at Position) {
	if h.Event != nil {
		h.Event(ev, at)
	}
}

func (h HandlerFuncs) OnRuntimeStatus(st *lifecyclev1.RuntimeStatus, at Position) {
	if h.RuntimeStatus != nil {
		h.RuntimeStatus(st, at)
	}
}

// Options configure a Client.
type Options struct {
	// Address is pleg's unix socket (a path, or unix:///path) or a
	// loopback TCP address (host:port). Default DefaultAddress.
	Address string
	// Filter selects pods and events (nil: everything).
	Filter *lifecyclev1.Filter
	// Fields asks for optional fields ("identity").
	Fields []string
	// Cursor resumes from a cursor kept from an earlier run (empty: start
	// with a snapshot). If it cannot be resumed from, Run resyncs.
	Cursor string
	// InitialBackoff and MaxBackoff bound the wait between failed
	// attempts (it doubles, with jitter, from the first to the second;
	// defaults DefaultInitialBackoff and DefaultMaxBackoff).
	InitialBackoff, MaxBackoff time.Duration
	// Logger receives reconnections and resyncs.
	Logger logr.Logger
	// DialOptions are added to the gRPC connection's.
	DialOptions []grpc.DialOption
	// Clock times the backoff; the real clock when nil.
	Clock clock.WithTicker
}

// Stats counts what Run went through.
type Stats struct {
	// Watches is how many Watch calls were made.
	Watches int
	// Resyncs is how many times pleg answered resync_required.
	Resyncs int
	// Cuts is how many times pleg cut the watch for not reading.
	Cuts int
	// Failures is how many watches ended with another error.
	Failures int
	// Events and Bookmarks count the messages received; an event is
	// counted before its handler is called.
	Events, Bookmarks int
}

// Client watches one pleg. Create it with New; Close it when done.
type Client struct {
	o    Options
	conn *grpc.ClientConn
	api  lifecyclev1.LifecycleClient
	log  logr.Logger

	mu     sync.Mutex
	cursor string
	stats  Stats
}

// New returns a client of o.Address. It does no I/O: Run connects.
func New(o Options) (*Client, error) {
	if o.Address == "" {
		o.Address = DefaultAddress
	}
	if o.InitialBackoff <= 0 {
		o.InitialBackoff = DefaultInitialBackoff
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = DefaultMaxBackoff
	}
	if o.MaxBackoff < o.InitialBackoff {
		o.MaxBackoff = o.InitialBackoff
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
	target, err := Target(o.Address)
	if err != nil {
		return nil, err
	}
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// Reconnect as fast as Run's own backoff asks, not gRPC's
		// default of up to two minutes.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
			BaseDelay: o.InitialBackoff, Multiplier: 2, Jitter: 0.2, MaxDelay: o.MaxBackoff},
			MinConnectTimeout: 5 * time.Second}),
	}, o.DialOptions...)
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, fmt.Errorf("lifecycle client for %s: %w", o.Address, err)
	}
	return &Client{o: o, conn: conn, api: lifecyclev1.NewLifecycleClient(conn), log: o.Logger, cursor: o.Cursor}, nil
}

// Target is the gRPC target of an address: a path or unix:// URL is a
// unix socket, anything else host:port.
func Target(address string) (string, error) {
	switch {
	case strings.HasPrefix(address, "unix://"), strings.HasPrefix(address, "unix:"):
		return address, nil
	case strings.HasPrefix(address, "/"), strings.HasPrefix(address, "./"), strings.HasPrefix(address, "../"):
		return "unix://" + address, nil
	case strings.Contains(address, "://"):
		return "", fmt.Errorf("lifecycle client: address %q: want a unix socket path, unix:///path or host:port", address)
	}
	return "dns:///" + address, nil
}

// API returns the generated client, for the unary lookups (ListPods,
// GetPod, GetContainer).
func (c *Client) API() lifecyclev1.LifecycleClient { return c.api }

// Close closes the connection; Run then returns.
func (c *Client) Close() error { return c.conn.Close() }

// Cursor returns the cursor of the last message handled: Options.Cursor
// of a later run resumes after it.
func (c *Client) Cursor() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cursor
}

// Stats returns the counts so far.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// ErrInvalidRequest wraps pleg's InvalidArgument answer (a bad filter or
// field): retrying cannot help, so Run returns it.
var ErrInvalidRequest = errors.New("lifecycle client: pleg refused the request")

// Run watches until ctx ends (it then returns nil), reconnecting and
// resuming as needed. It returns an error only for a request pleg refuses
// (ErrInvalidRequest) or a closed client. Run must not be called twice at
// once.
func (c *Client) Run(ctx context.Context, h Handler) error {
	// wait is the next pause; base the backoff it is drawn from.
	var wait, base time.Duration
	for {
		if wait > 0 {
			t := c.o.Clock.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C():
			}
		}
		progressed, err := c.watch(ctx, h)
		if ctx.Err() != nil {
			return nil
		}
		st := status.Convert(err)
		switch {
		case err == nil:
			// A resync_required ended the stream: watch again at once.
			wait, base = 0, 0
			continue
		case st.Code() == codes.InvalidArgument:
			return fmt.Errorf("%w: %s", ErrInvalidRequest, st.Message())
		case st.Code() == codes.Canceled && c.closed():
			return errors.New("lifecycle client: closed")
		}
		c.mu.Lock()
		if reason, _ := Reason(err); reason == lifecyclev1.ReasonNotReading {
			c.stats.Cuts++
		} else {
			c.stats.Failures++
		}
		c.mu.Unlock()
		// A watch that handled something resumes at once (a cut, a
		// restart); one that failed outright backs off.
		if progressed {
			wait, base = 0, 0
		} else {
			base = c.nextBackoff(base)
			wait = base - time.Duration(rand.Int64N(int64(base)/5+1))
		}
		c.log.Info("Lifecycle watch ended; resuming", "address", c.o.Address, "code", st.Code().String(),
			"message", st.Message(), "cursor", c.Cursor(), "retryIn", wait)
	}
}

// closed reports whether Close was called.
func (c *Client) closed() bool {
	return c.conn.GetState() == connectivity.Shutdown
}

// Reason returns the reason and cursor of the ErrorInfo detail pleg puts
// on a watch's end (lifecyclev1.ReasonNotReading, ReasonShuttingDown,
// ReasonTooManyWatchers); "" when err has none.
func Reason(err error) (reason, cursor string) {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == lifecyclev1.ErrorDomain {
			return info.GetReason(), info.GetMetadata()[lifecyclev1.MetadataCursor]
		}
	}
	return "", ""
}

// nextBackoff doubles prev within the bounds (the pause is up to 20%
// less, at random).
func (c *Client) nextBackoff(prev time.Duration) time.Duration {
	if prev == 0 {
		return c.o.InitialBackoff
	}
	return min(prev*2, c.o.MaxBackoff)
}

// watch runs one Watch from the current cursor and hands its messages to
// h. It returns nil after a resync_required (the cursor is then cleared),
// else how the stream ended; progressed says whether a message was
// handled.
func (c *Client) watch(ctx context.Context, h Handler) (progressed bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cursor := c.Cursor()
	c.mu.Lock()
	c.stats.Watches++
	c.mu.Unlock()
	stream, err := c.api.Watch(ctx, &lifecyclev1.WatchRequest{Cursor: cursor, Filter: c.o.Filter, Fields: c.o.Fields})
	if err != nil {
		return false, err
	}
	// A snapshot in progress: its pods, handed over at its end. Its
	// messages' cursors are not positions to resume from (a break in the
	// middle of a snapshot starts a new one).
	var snapshot []*lifecyclev1.Pod
	for {
		m, err := stream.Recv()
		if err != nil {
			return progressed, err
		}
		at := Position{Cursor: m.GetCursor(), Time: m.GetTime().AsTime()}
		switch x := m.GetMessage().(type) {
		case *lifecyclev1.WatchResponse_Snapshot:
			snapshot = append(snapshot, x.Snapshot)
			continue
		case *lifecyclev1.WatchResponse_SnapshotEnd:
			if snapshot == nil {
				snapshot = []*lifecyclev1.Pod{}
			}
			h.OnResync(snapshot, at)
			snapshot = nil
		case *lifecyclev1.WatchResponse_Event:
			// Counted before the handler runs: once a handler has seen
			// an event, Stats includes it.
			c.count(func(s *Stats) { s.Events++ })
			h.OnEvent(x.Event, at)
		case *lifecyclev1.WatchResponse_RuntimeStatus:
			h.OnRuntimeStatus(x.RuntimeStatus, at)
		case *lifecyclev1.WatchResponse_Bookmark:
			c.count(func(s *Stats) { s.Bookmarks++ })
		case *lifecyclev1.WatchResponse_ResyncRequired:
			c.log.Info("pleg cannot resume this watch; watching again from a snapshot", "address", c.o.Address,
				"reason", x.ResyncRequired.GetReason(), "cursor", cursor)
			c.mu.Lock()
			c.cursor = ""
			c.stats.Resyncs++
			c.mu.Unlock()
			// The stream ends after it.
			return true, nil
		default:
			continue // a message type newer than this client
		}
		progressed = true
		c.mu.Lock()
		c.cursor = at.Cursor
		c.mu.Unlock()
	}
}

func (c *Client) count(f func(*Stats)) {
	c.mu.Lock()
	f(&c.stats)
	c.mu.Unlock()
}
