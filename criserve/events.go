package criserve

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/internal/outbox"
	"github.com/podlifecycle/pleg/journal"
)

// eventType is the CRI event of a journal transition; ok is false for the
// transitions CRI has no event for (PodSync, PodUpdated).
func eventType(t string) (runtimeapi.ContainerEventType, bool) {
	switch t {
	case "ContainerStarted":
		return runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT, true
	case "ContainerDied":
		return runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, true
	case "ContainerRemoved":
		return runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT, true
	}
	return 0, false
}

// containerEvents are the CRI events of a journal event: one per
// transition CRI has an event for, each with the pod's sandbox status
// (the sandbox the item belongs to, or the newest) and its containers'
// statuses, as containerd sends them.
func containerEvents(m journal.Message) []*runtimeapi.ContainerEventResponse {
	var out []*runtimeapi.ContainerEventResponse
	p := m.Pod
	if p == nil {
		return nil
	}
	for _, t := range m.Transitions {
		typ, ok := eventType(t.Type)
		if !ok || t.ContainerID == "" {
			continue
		}
		ev := &runtimeapi.ContainerEventResponse{ContainerId: t.ContainerID, ContainerEventType: typ, CreatedAt: nanos(m.Time)}
		var sb *journal.Sandbox
		for i := range p.Sandboxes {
			if p.Sandboxes[i].ID == t.ContainerID {
				sb = p.Sandboxes[i]
			}
		}
		if sb == nil {
			for i := range p.Containers {
				if p.Containers[i].ID == t.ContainerID {
					sb = sandboxOf(p, p.Containers[i])
				}
			}
		}
		if sb == nil {
			for i := range p.Sandboxes {
				if sb == nil || p.Sandboxes[i].CreatedAt.After(sb.CreatedAt) {
					sb = p.Sandboxes[i]
				}
			}
		}
		if sb != nil {
			ev.PodSandboxStatus = sandboxStatus(p, sb)
			for i := range p.Containers {
				if sandboxOf(p, p.Containers[i]) == sb {
					ev.ContainersStatuses = append(ev.ContainersStatuses, containerStatus(p.Containers[i]))
				}
			}
		}
		out = append(out, ev)
	}
	return out
}

// errCut is the cause of a stream cut for not reading.
var errCut = errors.New("cut") // a stream's outbox's Abort

// GetContainerEvents streams the journal's container transitions from
// now on, in the runtime's event shape. It stays open across runtime
// restarts (the journal does); a client that reads nothing for the stall
// timeout while events wait is cut with ResourceExhausted, one that fell
// behind the journal's retention gets Aborted: no event is dropped
// silently.
func (r *runtimeServer) GetContainerEvents(_ *runtimeapi.GetEventsRequest, stream grpc.ServerStreamingServer[runtimeapi.ContainerEventResponse]) error {
	s := r.s
	select {
	case s.events <- struct{}{}:
		defer func() { <-s.events }()
	default:
		return status.Errorf(codes.ResourceExhausted, "pleg's CRI endpoint serves at most %d GetContainerEvents streams at once; retry later", s.cfg.MaxStreams)
	}
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	defer context.AfterFunc(s.stopping, func() { cancel(context.Cause(s.stopping)) })()

	v := s.viewOf(ctx)
	if !v.all && v.pod == nil {
		// In no pod: nothing to see, until the client or pleg ends it.
		<-ctx.Done()
		return s.eventsEnded(ctx, ctx.Err())
	}
	var f *journal.Filter
	if !v.all {
		var err error
		if f, err = journal.NewFilter(journal.FilterSpec{PodUIDs: []string{string(v.pod.UID)}}); err != nil {
			return status.Errorf(codes.Internal, "filtering the caller's pod: %v", err)
		}
	}
	jw, err := s.j.Watch(s.j.Head().String(), f)
	if err != nil {
		return status.Errorf(codes.Internal, "watching the journal: %v", err)
	}
	defer jw.Close()
	s.watching.Add(1)
	defer s.watching.Add(-1)

	// internal/outbox's rule, as for the lifecycle Watch: at most
	// QueueSize events ahead of the client, Push waits for room, and a
	// client that takes nothing for the stall timeout while events wait
	// is cut.
	ob := outbox.ForGRPC(outbox.GRPCConfig[*runtimeapi.ContainerEventResponse]{
		Max:          s.cfg.QueueSize,
		StallTimeout: s.cfg.StallTimeout,
		Clock:        s.cfg.Clock,
		Send:         stream.Send,
		Cancel:       cancel,
		Cut:          errCut,
		Senders:      &s.senders,
	})
	defer ob.Close()
	for {
		m, err := jw.Next(ctx)
		if err != nil {
			return s.eventsEnded(ctx, err)
		}
		switch m.Type {
		case journal.ResyncRequired:
			s.cfg.Metrics.cuts.WithLabelValues(s.cfg.Flag, "fell_behind").Inc()
			return status.Errorf(codes.Aborted, "pleg's CRI endpoint: this GetContainerEvents stream fell behind the journal's retention (%s): events were lost; list again and call GetContainerEvents again", m.Reason)
		case journal.Event:
		default:
			continue
		}
		for _, ev := range containerEvents(m) {
			if err := ob.Push(ctx, ev); err != nil {
				return s.eventsEnded(ctx, err)
			}
		}
	}
}

// eventsEnded is the status a GetContainerEvents stream ends with after
// err.
func (s *Server) eventsEnded(ctx context.Context, err error) error {
	var drop *outbox.DropError
	if errors.As(err, &drop) || errors.Is(err, errCut) || errors.Is(context.Cause(ctx), errCut) {
		s.cfg.Metrics.cuts.WithLabelValues(s.cfg.Flag, "not_reading").Inc()
		s.log.Info("Cut a GetContainerEvents client that did not read", "stallTimeout", s.cfg.StallTimeout, "peer", peerString(ctx))
		return status.Errorf(codes.ResourceExhausted, "pleg's CRI endpoint: the client read no event for %v; call GetContainerEvents again (events meanwhile are lost: list again)", s.cfg.StallTimeout)
	}
	cause := err
	if ctx.Err() != nil {
		cause = context.Cause(ctx)
	}
	switch {
	case errors.Is(cause, errShutdown):
		return status.Error(codes.Unavailable, "pleg is shutting down")
	case errors.Is(cause, context.Canceled), errors.Is(cause, context.DeadlineExceeded):
		return status.FromContextError(cause).Err()
	}
	if _, ok := status.FromError(cause); ok {
		return cause
	}
	return status.Error(codes.Internal, fmt.Sprintf("GetContainerEvents failed: %v", cause))
}
