package cri

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/metrics"
)

// WatchEvents opens the runtime's container event stream
// (GetContainerEvents) and calls fn with each event, in the order received,
// until ctx is done (it returns ctx.Err()) or the stream fails (it returns
// the wrapped error; a stream the runtime closes yields an error matching
// io.EOF). A runtime without the stream (Unimplemented) yields an error
// matching cruntime.ErrEventsUnsupported.
//
// The stream has no timeout; only ctx bounds it. Each stream counts once as
// a get_container_events operation, timed to its establishment; it counts
// as an operation error when it could not be opened or later ends for any
// reason but ctx.
//
// Event types CRI may add later pass through as cruntime.EventType values
// beyond EventDeleted.
func (c *Client) WatchEvents(ctx context.Context, connected func(), fn func(cruntime.Event)) error {
	var done func(time.Duration, error)
	if t := cruntime.CallTracerFrom(ctx); t != nil {
		done = t.StartCall(metrics.OpGetContainerEvents, "")
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	// Through the lean codec: each event is read from the wire
	// (eventReply), not decoded whole.
	stream, err := c.openStream(sctx, runtimeapi.RuntimeService_GetContainerEvents_FullMethodName, &runtimeapi.GetEventsRequest{})
	d := time.Since(start)
	if err != nil {
		err = c.streamError(ctx, err)
	}
	c.metrics.ObserveRuntimeOperation(metrics.OpGetContainerEvents, d, err)
	if done != nil {
		done(d, err)
	}
	if err != nil {
		return err
	}
	if connected != nil {
		connected()
	}

	var r eventReply
	for {
		if err := stream.RecvMsg(&r); err != nil {
			err = c.streamError(ctx, err)
			if ctx.Err() == nil && c.metrics != nil {
				c.metrics.RuntimeOperationErrors.WithLabelValues(metrics.OpGetContainerEvents).Inc()
			}
			return err
		}
		fn(r.ev)
	}
}

// serverStream is the description of CRI's server-streaming RPCs: the
// container events and the streamed listings.
var serverStream = grpc.StreamDesc{ServerStreams: true}

// openStream opens the server-streaming RPC method with the lean codec and
// sends its one request. ctx bounds the stream, and its cancellation ends
// it.
func (c *Client) openStream(ctx context.Context, method string, req any) (grpc.ClientStream, error) {
	s, err := c.conn.NewStream(ctx, &serverStream, method, grpc.ForceCodecV2(leanCodec{}))
	if err != nil {
		return nil, err
	}
	// io.EOF from SendMsg: the server ended the stream, RecvMsg says how.
	if err := s.SendMsg(req); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if err := s.CloseSend(); err != nil {
		return nil, err
	}
	return s, nil
}

// streamError turns an error of the event stream into WatchEvents' error.
func (c *Client) streamError(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	switch {
	case errors.Is(err, io.EOF):
		return fmt.Errorf("GetContainerEvents: stream closed by the runtime at %s: %w", c.endpoint, err)
	case status.Code(err) == codes.Unimplemented:
		return fmt.Errorf("%w: GetContainerEvents: %w", cruntime.ErrEventsUnsupported, err)
	default:
		return newCallError("GetContainerEvents", "", c.endpoint, c.path, err)
	}
}

// eventFrom maps one CRI container event.
func eventFrom(r *runtimeapi.ContainerEventResponse) cruntime.Event {
	ev := cruntime.Event{
		ContainerID: r.ContainerId,
		Type:        eventType(r.ContainerEventType),
		CreatedAt:   nsTime(r.CreatedAt),
	}
	if md := r.GetPodSandboxStatus().GetMetadata(); md != nil && md.Uid != "" {
		ev.PodUID, ev.PodName, ev.PodNamespace = types.UID(md.Uid), md.Name, md.Namespace
		return ev
	}
	if len(r.ContainersStatuses) > 0 {
		l := r.ContainersStatuses[0].GetLabels()
		if uid := l[cruntime.LabelPodUID]; uid != "" {
			ev.PodUID, ev.PodName, ev.PodNamespace = types.UID(uid), l[cruntime.LabelPodName], l[cruntime.LabelPodNamespace]
		}
	}
	return ev
}

// eventType maps a CRI container event type.
func eventType(t runtimeapi.ContainerEventType) cruntime.EventType {
	switch t {
	case runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT:
		return cruntime.EventCreated
	case runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT:
		return cruntime.EventStarted
	case runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT:
		return cruntime.EventStopped
	case runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT:
		return cruntime.EventDeleted
	default:
		return cruntime.EventType(t)
	}
}
