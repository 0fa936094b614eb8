package cri

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime/cri/directlist"
	"github.com/podlifecycle/pleg/metrics"
)

// Streaming lists (KEP-5825, k8s.io/cri-api v0.37: StreamPodSandboxes and
// StreamContainers). A unary ListPodSandbox or ListContainers reply is one
// gRPC message, and runtimes send at most 16 MiB in one (containerd's
// default max_send_message_size): a node whose listing is larger cannot be
// listed at all (ResourceExhausted), kubernetes#63858. The streaming RPCs
// send the same items in batches (containerd 2.4: 5,000 items a message),
// each a message of its own, and the client decodes each batch as it
// arrives into the same reply, through the same memo: the items, the
// listing and the delta inspection are those of the unary calls.

// ListStreaming says whether ListPods lists through the runtime's
// streaming list RPCs.
type ListStreaming int

const (
	// ListStreamingAuto streams when the runtime has the RPCs: an
	// Unimplemented answer makes the client list with the unary calls on
	// that connection, and probe again once it has reconnected (a runtime
	// restarted, perhaps upgraded). The default.
	ListStreamingAuto ListStreaming = iota
	// ListStreamingOn always streams: a runtime without the RPCs fails the
	// listing.
	ListStreamingOn
	// ListStreamingOff always lists with the unary calls, as the kubelet
	// does with its CRIListStreaming gate off (its default in v1.37).
	ListStreamingOff
)

var listStreamingNames = [...]string{ListStreamingAuto: "auto", ListStreamingOn: "on", ListStreamingOff: "off"}

func (m ListStreaming) String() string {
	if m < 0 || int(m) >= len(listStreamingNames) {
		return fmt.Sprintf("ListStreaming(%d)", int(m))
	}
	return listStreamingNames[m]
}

// ParseListStreaming parses "auto", "on" or "off".
func ParseListStreaming(s string) (ListStreaming, error) {
	for m, name := range listStreamingNames {
		if s == name {
			return ListStreaming(m), nil
		}
	}
	return 0, fmt.Errorf("list streaming %q: want auto, on or off", s)
}

// WithListStreaming sets whether ListPods uses the runtime's streaming
// list RPCs (default ListStreamingAuto). ListPod (one pod, filtered by the
// runtime) always makes the unary calls: its replies are small.
func WithListStreaming(m ListStreaming) Option {
	return func(o *options) { o.listStreaming = m }
}

// ErrListTooLarge matches (errors.Is) the error of a listing whose reply,
// or one batch of a streamed reply, exceeded the gRPC message limit.
var ErrListTooLarge = errors.New("list reply larger than the gRPC message limit")

// listTooLargeError is a listing that hit the message limit; it says what
// to do about it in its one line.
type listTooLargeError struct {
	streaming bool
	err       *CallError
}

func (e *listTooLargeError) Error() string {
	if e.streaming {
		return fmt.Sprintf("%s: one batch of the streamed listing exceeds the %d MiB gRPC message limit (the runtime chose its size): %v",
			e.err.Method, maxMsgSize>>20, e.err.Err)
	}
	return fmt.Sprintf("%s: the listing exceeds the %d MiB gRPC message limit and list streaming is off: use --list-streaming=auto "+
		"(cri.WithListStreaming), which lists in batches when the runtime has KEP-5825's streaming RPCs (containerd 2.4 and later): %v",
		e.err.Method, maxMsgSize>>20, e.err.Err)
}

func (e *listTooLargeError) Unwrap() []error { return []error{ErrListTooLarge, e.err} }

// connCounter is a gRPC stats handler that counts the connections the
// client made and lost: a count that moved since an Unimplemented answer
// means the connection it came on is gone, and the next one may be to
// another runtime binary (restarted, perhaps upgraded).
type connCounter struct{ n *atomic.Uint64 }

func (connCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context   { return ctx }
func (connCounter) HandleRPC(context.Context, stats.RPCStats)                         {}
func (connCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (c connCounter) HandleConn(_ context.Context, s stats.ConnStats) {
	switch s.(type) {
	case *stats.ConnBegin, *stats.ConnEnd:
		c.n.Add(1)
	}
}

// streamLists reports whether the next listing streams.
func (c *Client) streamLists() bool {
	switch c.listStreaming {
	case ListStreamingOn:
		return true
	case ListStreamingOff:
		return false
	}
	no := c.noStreamConn.Load()
	return no == 0 || no-1 != c.conns.Load()
}

// ListStreamingActive reports whether the client's next listing will use
// the streaming RPCs: false with ListStreamingOff, and with
// ListStreamingAuto once the runtime answered Unimplemented on the current
// connection.
func (c *Client) ListStreamingActive() bool { return c.streamLists() }

// listCall is one unfiltered list call of ListPods.
type listCall struct {
	op, method, streamMethod string // metric operation, the unary and streaming methods' names
	unary, streamed          string // full method names
	req, streamReq           proto.Message
}

var (
	listSandboxesCall = listCall{
		op: metrics.OpListPodSandbox, method: "ListPodSandbox", streamMethod: "StreamPodSandboxes",
		unary:    runtimeapi.RuntimeService_ListPodSandbox_FullMethodName,
		streamed: runtimeapi.RuntimeService_StreamPodSandboxes_FullMethodName,
		req:      &runtimeapi.ListPodSandboxRequest{}, streamReq: &runtimeapi.StreamPodSandboxesRequest{},
	}
	listContainersCall = listCall{
		op: metrics.OpListContainers, method: "ListContainers", streamMethod: "StreamContainers",
		unary:    runtimeapi.RuntimeService_ListContainers_FullMethodName,
		streamed: runtimeapi.RuntimeService_StreamContainers_FullMethodName,
		req:      &runtimeapi.ListContainersRequest{}, streamReq: &runtimeapi.StreamContainersRequest{},
	}
)

// list makes one unfiltered list call into r: streamed when the mode and
// the runtime allow it, else unary. It is one runtime operation, counted,
// timed and traced as the unary call is
// (kubelet_runtime_operations_*{operation_type="list_containers"}), as the
// kubelet counts its listings whether streamed or not: a stream the runtime
// does not implement and the unary call that follows are one operation.
// The client's timeout bounds the whole of it.
func (c *Client) list(ctx context.Context, lc listCall, r *listReply) error {
	var tooLarge bool
	err := c.callNamed(ctx, lc.op, "", func(ctx context.Context) (string, error) {
		if c.streamLists() {
			batches, err := c.listStream(ctx, lc, r)
			if err == nil || batches > 0 || status.Code(err) != codes.Unimplemented || c.listStreaming != ListStreamingAuto {
				tooLarge = status.Code(err) == codes.ResourceExhausted
				return lc.streamMethod, err
			}
			// The runtime predates KEP-5825: unary on this connection.
			if conns := c.conns.Load(); c.noStreamConn.Swap(conns+1) != conns+1 {
				c.log.V(2).Info("The runtime has no streaming lists; listing with unary calls until it reconnects", "method", lc.streamed)
			}
		}
		err := c.listUnary(ctx, lc, r)
		tooLarge = status.Code(err) == codes.ResourceExhausted
		return lc.method, err
	})
	if ce := (*CallError)(nil); tooLarge && errors.As(err, &ce) {
		return &listTooLargeError{streaming: ce.Method == lc.streamMethod, err: ce}
	}
	return err
}

// listStream receives a streamed listing into r, batch by batch: each
// message is decoded (and its buffers released) before the next is read.
// It returns the number of batches received.
func (c *Client) listStream(ctx context.Context, lc listCall, r *listReply) (int, error) {
	if c.direct != nil {
		return c.direct.Call(ctx, lc.streamed, lc.streamReq, false, r.decode)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream whatever happened to it
	s, err := c.openStream(ctx, lc.streamed, lc.streamReq)
	if err != nil {
		return 0, err
	}
	for n := 0; ; n++ {
		if err := s.RecvMsg(r); err != nil {
			if errors.Is(err, io.EOF) {
				return n, nil
			}
			return n, err
		}
	}
}

// listUnary receives a unary listing into r.
func (c *Client) listUnary(ctx context.Context, lc listCall, r *listReply) error {
	if c.direct != nil {
		_, err := c.direct.Call(ctx, lc.unary, lc.req, true, r.decode)
		return err
	}
	return c.conn.Invoke(ctx, lc.unary, lc.req, r, grpc.ForceCodecV2(leanCodec{}))
}

// decode decodes one message of a direct listing into r.
func (r *listReply) decode(m *directlist.Message) error { return decodeListFrom(m, r) }
