package cri

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/cruntime/cri/directlist"
	"github.com/podlifecycle/pleg/metrics"
)

const (
	// DefaultTimeout is the per-call timeout of unary calls, the kubelet's
	// default --runtime-request-timeout.
	DefaultTimeout = 2 * time.Minute

	// maxMsgSize bounds the messages sent to and received from the runtime.
	maxMsgSize = 16 << 20
	// windowSize is the HTTP/2 flow-control window of the connection and
	// of each call; readBufferSize the connection's read buffer.
	windowSize     = 16 << 20
	readBufferSize = 256 << 10

	// criAPIVersion is what Version sends as the client's API version.
	criAPIVersion = "v1"
)

var (
	_ cruntime.Runtime       = (*Client)(nil)
	_ cruntime.EventSource   = (*Client)(nil)
	_ cruntime.StatusChecker = (*Client)(nil)
)

// Client talks CRI v1 to one container runtime. It is safe for concurrent
// use. Create it with Dial and release it with Close.
type Client struct {
	endpoint string
	path     string // unix socket path
	conn     *grpc.ClientConn
	rs       runtimeapi.RuntimeServiceClient

	timeout           time.Duration
	statusConcurrency int
	metrics           *metrics.Metrics
	log               logr.Logger
	verbose           VerboseSink        // nil: status calls are not verbose
	memo              memo               // what the last unfiltered listing keeps for the next
	shared            *cruntime.Interner // the statuses' image references, labels and annotations; swept after each listing

	listStreaming ListStreaming
	direct        lister         // nil: unfiltered listings go through conn (WithDirectLists)
	conns         *atomic.Uint64 // connections made and lost so far (connCounter)
	noStreamConn  atomic.Uint64  // 1 + conns when the runtime answered Unimplemented to a streamed listing; 0: never
}

type options struct {
	timeout           time.Duration
	statusConcurrency int
	metrics           *metrics.Metrics
	log               *logr.Logger
	listStreaming     ListStreaming
	grpcLists         bool
	verbose           VerboseSink
	intern            cruntime.InternLimits // zero: the defaults (tests set it)
}

// Option configures a Client.
type Option func(*options)

// WithTimeout sets the timeout of every unary call (default DefaultTimeout).
// d <= 0 disables it: calls are then bounded by their context only. The
// container event stream never has a timeout.
func WithTimeout(d time.Duration) Option {
	return func(o *options) { o.timeout = d }
}

// DefaultStatusConcurrency is how many status calls of one pod PodStatus
// makes at once by default.
const DefaultStatusConcurrency = 4

// WithStatusConcurrency sets how many status calls of one pod PodStatus
// makes at once (default DefaultStatusConcurrency); 1 makes them one after
// another, as the kubelet does.
func WithStatusConcurrency(n int) Option {
	return func(o *options) { o.statusConcurrency = max(n, 1) }
}

// WithMetrics counts and times every runtime call in m
// (kubelet_runtime_operations_*). Without it nothing is recorded.
func WithMetrics(m *metrics.Metrics) Option {
	return func(o *options) { o.metrics = m }
}

// WithLogger sets the logger (default: klog's, named "cri"). Skipped
// malformed items are logged at V(4).
func WithLogger(l logr.Logger) Option {
	return func(o *options) { o.log = &l }
}

// VerboseSink receives the verbose ContainerStatus answers of the
// client's status calls (WithVerboseStatuses), each with the ID pleg
// listed the container by and the state the answer gives. It is called on
// the calling goroutine, before ItemStatuses or Identities returns, so
// before the generator applies the status; it must not block.
type VerboseSink interface {
	ContainerVerbose(id string, state cruntime.State, resp *runtimeapi.ContainerStatusResponse)
}

// WithVerboseStatuses makes every ContainerStatus call of ItemStatuses
// verbose and hands each answer to s (Identities' verbose calls too):
// pleg's read-only CRI endpoint answers its clients' verbose statuses from
// them (docs/cri.md). It costs the runtime the info's encoding and the
// connection its bytes (docs/performance.md); the statuses the generator
// keeps are the same. PodSandboxStatus calls stay plain: containerd's
// verbose one asks the sandbox's shim for its task's status, so a hung
// shim would hang it (test/e2e/README.md), where the plain one answers
// from containerd's own store. Nil: plain calls.
func WithVerboseStatuses(s VerboseSink) Option {
	return func(o *options) { o.verbose = s }
}

// Dial returns a client of the CRI runtime at endpoint. It does no I/O: the
// connection is made by the first call and remade as needed.
//
// Accepted endpoints name a unix socket by absolute path:
// "unix:///run/containerd/containerd.sock", "unix:/run/x.sock", a bare
// "/run/x.sock", and "passthrough:///" followed by any of these. Anything
// else (tcp://, npipe://, a relative path, an empty string) is an error.
func Dial(endpoint string, opts ...Option) (*Client, error) {
	path, err := socketPath(endpoint)
	if err != nil {
		return nil, err
	}
	o := options{timeout: DefaultTimeout, statusConcurrency: DefaultStatusConcurrency}
	for _, opt := range opts {
		opt(&o)
	}
	log := klog.Background().WithName("cri")
	if o.log != nil {
		log = *o.log
	}

	conns := &atomic.Uint64{}
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}
	conn, err := grpc.NewClient("passthrough:///"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dialer),
		// The socket path is no valid :authority; runtimes ignore it.
		grpc.WithAuthority("localhost"),
		// A relist's two list replies are megabytes on a big node: a
		// window that holds them whole spares the flow-control round
		// trips, and a larger read buffer most of the read calls.
		grpc.WithInitialWindowSize(windowSize),
		grpc.WithInitialConnWindowSize(windowSize),
		grpc.WithReadBufferSize(readBufferSize),
		experimental.WithBufferPool(&bufferPool{}),
		grpc.WithStatsHandler(connCounter{conns}),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(maxMsgSize),
			grpc.MaxCallSendMsgSize(maxMsgSize),
		),
		// Reconnect soon after a runtime restart: dialing a local socket
		// is cheap, so retry within a second at most.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  100 * time.Millisecond,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   time.Second,
			},
			MinConnectTimeout: 5 * time.Second,
		}),
	)
	if err != nil {
		return nil, &EndpointError{Endpoint: endpoint, Reason: err.Error()}
	}
	c := &Client{
		endpoint:          endpoint,
		path:              path,
		conn:              conn,
		rs:                runtimeapi.NewRuntimeServiceClient(conn),
		timeout:           o.timeout,
		statusConcurrency: o.statusConcurrency,
		verbose:           o.verbose,
		metrics:           o.metrics,
		log:               log,
		listStreaming:     o.listStreaming,
		conns:             conns,
		shared:            cruntime.NewInterner(o.intern),
	}
	if !o.grpcLists {
		c.direct = directlist.New(path, maxMsgSize, conns)
	}
	return c, nil
}

// socketPath returns the unix socket path an endpoint names.
func socketPath(endpoint string) (string, error) {
	const hint = "want unix:///absolute/path/to/socket"
	if endpoint == "" {
		return "", &EndpointError{Reason: hint}
	}
	rest := endpoint
	if r, ok := strings.CutPrefix(rest, "passthrough:///"); ok {
		rest = r
	}
	if r, ok := strings.CutPrefix(rest, "unix:"); ok {
		// unix:///abs and unix:/abs; not unix://host/path.
		rest = r
		if r, ok := strings.CutPrefix(rest, "//"); ok {
			rest = r
		}
	} else if i := strings.Index(rest, "://"); i >= 0 {
		return "", &EndpointError{Endpoint: endpoint,
			Reason: fmt.Sprintf("unsupported scheme %q, only unix sockets are supported; %s", rest[:i], hint)}
	}
	if rest == "" {
		return "", &EndpointError{Endpoint: endpoint, Reason: "no socket path; " + hint}
	}
	if !strings.HasPrefix(rest, "/") {
		return "", &EndpointError{Endpoint: endpoint, Reason: fmt.Sprintf("socket path %q is not absolute; %s", rest, hint)}
	}
	return filepath.Clean(rest), nil
}

// RuntimeService returns the raw CRI runtime service client on the
// Client's connection, for calls the runtime interfaces do not cover (pleg
// diagnose probes shims with a verbose PodSandboxStatus). Calls made on it
// are not timed out, counted or traced by the Client.
func (c *Client) RuntimeService() runtimeapi.RuntimeServiceClient { return c.rs }

// ImageService returns the raw CRI image service client on the Client's
// connection (pleg's CRI endpoint passes image queries through). Calls
// made on it are not timed out, counted or traced by the Client.
func (c *Client) ImageService() runtimeapi.ImageServiceClient {
	return runtimeapi.NewImageServiceClient(c.conn)
}

// Endpoint returns the endpoint as given to Dial.
func (c *Client) Endpoint() string { return c.endpoint }

// Close closes the connections. Calls in flight fail.
func (c *Client) Close() error {
	if c.direct != nil {
		c.direct.Close()
	}
	return c.conn.Close()
}

// Version asks the runtime for its name and version (CRI Version). Use it to
// check that the runtime is reachable: its error names the endpoint.
func (c *Client) Version(ctx context.Context) (runtimeName, runtimeVersion string, err error) {
	var resp *runtimeapi.VersionResponse
	err = c.call(ctx, metrics.OpVersion, "Version", "", func(ctx context.Context) (err error) {
		resp, err = c.rs.Version(ctx, &runtimeapi.VersionRequest{Version: criAPIVersion})
		return err
	})
	if err != nil {
		if status.Code(err) == codes.Unimplemented {
			return "", "", fmt.Errorf("runtime at %s does not serve the CRI v1 runtime service: %w", c.endpoint, err)
		}
		return "", "", fmt.Errorf("connect to runtime at %s: %w", c.endpoint, err)
	}
	return resp.RuntimeName, resp.RuntimeVersion, nil
}

// call runs one unary CRI call under the client's timeout, counts and times
// it as op, and reports it to the context's call tracer. method and id name
// the call in the returned error (a *callError wrapping the gRPC error).
//
// Every error counts as an error in the metrics, NotFound included, as in
// the kubelet.
func (c *Client) call(ctx context.Context, op, method, id string, f func(context.Context) error) error {
	return c.callNamed(ctx, op, id, func(ctx context.Context) (string, error) { return method, f(ctx) })
}

// callNamed is call for an operation whose method f chooses as it goes (a
// listing streamed, or unary after the runtime turned the stream down):
// f returns the method its error is about.
func (c *Client) callNamed(ctx context.Context, op, id string, f func(context.Context) (string, error)) error {
	var done func(time.Duration, error)
	if t := cruntime.CallTracerFrom(ctx); t != nil {
		done = t.StartCall(op, id)
	}
	cctx, cancel := c.bound(ctx)
	start := time.Now()
	method, err := f(cctx)
	d := time.Since(start)
	cancel()
	if err != nil {
		err = newCallError(method, id, c.endpoint, c.path, err)
	}
	c.metrics.ObserveRuntimeOperation(op, d, err)
	if done != nil {
		done(d, err)
	}
	return err
}

// bound returns ctx under the client's per-call timeout, or ctx itself
// when WithTimeout disabled it.
func (c *Client) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.timeout > 0 {
		return context.WithTimeout(ctx, c.timeout)
	}
	return ctx, func() {}
}

// isNotFound reports whether err is a gRPC NotFound.
func isNotFound(err error) bool {
	return err != nil && status.Code(err) == codes.NotFound
}
