package server

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/internal/outbox"
	"github.com/podlifecycle/pleg/journal"
)

// Cut reasons (the label of pleg_lifecycle_watcher_cuts_total).
const (
	CutNotReading = "not_reading"
)

// outMsg is a message queued for a watch's sender: a *WatchResponse, or
// an *encoded one, and its cursor.
type outMsg struct {
	cursor journal.Cursor
	body   any
}

// watch is one open Watch.
type watch struct {
	peer string
	// sent is the sequence number of the last message handed to the
	// stream; its lag is the journal's head minus it.
	sent atomic.Uint64
	// sentCursor is the cursor of that message (nil before the first).
	sentCursor atomic.Pointer[journal.Cursor]
}

func (w *watch) cursor() string {
	if c := w.sentCursor.Load(); c != nil {
		return c.String()
	}
	return ""
}

// resumeHint tells a client where to resume from.
func (w *watch) resumeHint() string {
	if c := w.cursor(); c != "" {
		return "resume with cursor " + c + " (or a later one you received)"
	}
	return "watch again (nothing was sent)"
}

// status is a watch's end with an ErrorInfo detail of reason and its
// cursor.
func (w *watch) status(code codes.Code, reason, msg string) error {
	st := status.New(code, msg)
	info := &errdetails.ErrorInfo{Reason: reason, Domain: lifecyclev1.ErrorDomain}
	if c := w.cursor(); c != "" {
		info.Metadata = map[string]string{lifecyclev1.MetadataCursor: c}
	}
	if d, err := st.WithDetails(info); err == nil {
		st = d
	}
	return st.Err()
}

// errCut is the cause of a watch cut for not reading: its outbox's Abort.
var errCut = errors.New("cut")

// Watch streams the journal from the request's cursor through its filter.
func (s *Server) Watch(req *lifecyclev1.WatchRequest, stream grpc.ServerStreamingServer[lifecyclev1.WatchResponse]) error {
	f, err := Filter(req.GetFilter(), req.GetFields())
	if err != nil {
		return invalidArgument(err)
	}
	identity := false
	for _, fl := range req.GetFields() {
		identity = identity || fl == FieldIdentity
	}
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	default:
		return (&watch{}).status(codes.ResourceExhausted, lifecyclev1.ReasonTooManyWatchers,
			fmt.Sprintf("too many watchers (at most %d at once); retry later", s.cfg.MaxWatchers))
	}
	jw, err := s.j.Watch(req.GetCursor(), f)
	if err != nil {
		return invalidArgument(err)
	}
	defer jw.Close()

	w := &watch{peer: peerOfContext(stream.Context())}
	// Its lag counts from where it starts.
	w.sent.Store(jw.Position())
	s.mu.Lock()
	s.watches[w] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.watches, w)
		s.mu.Unlock()
	}()
	log := s.log.WithValues("peer", w.peer)
	log.V(1).Info("Watch started", "cursor", req.GetCursor(), "filter", req.GetFilter().String(), "fields", req.GetFields())

	// ctx ends with the client, the server's shutdown, or a failed Send.
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	defer context.AfterFunc(s.stopping, func() { cancel(context.Cause(s.stopping)) })()

	// The slow-consumer rule is internal/outbox's, as for every stream
	// pleg serves: at most QueueSize messages converted ahead of the
	// client, Push waits for room (the journal holds the rest), and a
	// client that takes nothing for the stall timeout while messages wait
	// is cut. A message is progress once SendMsg returned: gRPC's flow
	// control took it.
	ob := outbox.ForGRPC(outbox.GRPCConfig[outMsg]{
		Max:          s.cfg.QueueSize,
		StallTimeout: s.cfg.StallTimeout,
		Clock:        s.cfg.Clock,
		Send:         func(m outMsg) error { return stream.SendMsg(m.body) },
		Sent: func(m outMsg) {
			w.sent.Store(m.cursor.Seq)
			if c := w.sentCursor.Load(); c == nil || *c != m.cursor {
				w.sentCursor.Store(&m.cursor)
			}
		},
		Cancel:  cancel,
		Cut:     errCut,
		Senders: &s.senders,
	})
	defer ob.Close()

	for {
		m, err := jw.Next(ctx)
		if err != nil {
			return s.ended(ctx, w, err)
		}
		out := outMsg{cursor: m.Cursor}
		switch m.Type {
		case journal.Event, journal.Runtime:
			// The same bytes for every watcher: encoded once.
			if s.perWatcherEncoding {
				if r := WatchResponse(m, identity); r != nil {
					out.body = r
				}
			} else if e := s.encode(m, identity); e != nil {
				out.body = e
			}
		default:
			if r := WatchResponse(m, identity); r != nil {
				out.body = r
			}
		}
		if out.body == nil {
			continue
		}
		if err := ob.Push(ctx, out); err != nil {
			return s.ended(ctx, w, err)
		}
		if m.Type == journal.ResyncRequired {
			s.m.resyncs.WithLabelValues(resyncReason(m.Reason)).Inc()
			log.Info("Watcher must resync", "reason", m.Reason, "cursor", req.GetCursor())
			// The stream ends OK once the message is sent.
			if err := ob.Drain(ctx); err != nil {
				return s.ended(ctx, w, err)
			}
			return nil
		}
	}
}

// ended is the status a watch ends with after err.
func (s *Server) ended(ctx context.Context, w *watch, err error) error {
	log := s.log.WithValues("peer", w.peer)
	var drop *outbox.DropError
	if errors.As(err, &drop) || errors.Is(err, errCut) || errors.Is(context.Cause(ctx), errCut) {
		s.m.cuts.WithLabelValues(CutNotReading).Inc()
		log.Info("Cut a watcher that did not read", "stallTimeout", s.cfg.StallTimeout, "cursor", w.cursor())
		return w.status(codes.ResourceExhausted, lifecyclev1.ReasonNotReading,
			fmt.Sprintf("watcher did not read for %v; %s", s.cfg.StallTimeout, w.resumeHint()))
	}
	cause := err
	if ctx.Err() != nil {
		cause = context.Cause(ctx)
	}
	switch {
	case errors.Is(cause, errShutdown):
		log.V(1).Info("Watch ended: shutting down", "cursor", w.cursor())
		return w.status(codes.Unavailable, lifecyclev1.ReasonShuttingDown,
			fmt.Sprintf("pleg is shutting down; %s (a restarted pleg answers it with resync_required)", w.resumeHint()))
	case errors.Is(cause, context.Canceled), errors.Is(cause, context.DeadlineExceeded):
		log.V(1).Info("Watch ended: the client went away", "cursor", w.cursor())
		return status.FromContextError(cause).Err()
	}
	log.V(1).Info("Watch ended", "err", cause.Error(), "cursor", w.cursor())
	if _, ok := status.FromError(cause); ok {
		return cause
	}
	return status.Error(codes.Internal, fmt.Sprintf("watch failed: %v; %s", cause, w.resumeHint()))
}

// resyncReason is the metric label of a resync reason.
func resyncReason(reason string) string {
	switch reason {
	case journal.ReasonOtherEpoch:
		return "other_epoch"
	case journal.ReasonTooOld:
		return "too_old"
	case journal.ReasonFellBehind:
		return "fell_behind"
	case journal.ReasonFutureEvent:
		return "future_cursor"
	}
	return "other"
}
