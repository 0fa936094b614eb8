package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/podlifecycle/pleg/api/lifecycle/server"
	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/internal/outbox"
	"github.com/podlifecycle/pleg/internal/textfmt"
	"github.com/podlifecycle/pleg/journal"
)

// queryParams are the query parameters of /api/v1/events that name the
// journal's filter fields.
var queryParams = map[string]string{
	"namespaces":    "namespace",
	"labelSelector": "labelSelector",
	"podUIDs":       "podUID",
	"eventTypes":    "type",
}

// listParam returns a repeatable, comma-separated query parameter.
func listParam(q url.Values, name string) []string {
	var out []string
	for _, v := range q[name] {
		for _, item := range strings.Split(v, ",") {
			if item = strings.TrimSpace(item); item != "" {
				out = append(out, item)
			}
		}
	}
	return out
}

// eventsRequest is what a request to /api/v1/events asks for.
type eventsRequest struct {
	cursor   string
	filter   *journal.Filter
	identity bool
}

// parseEventsRequest reads the cursor (the Last-Event-ID header, else the
// cursor or lastEventId query parameter; journal.Watch checks it), the
// filters and the fields; its error names the bad parameter.
func parseEventsRequest(r *http.Request) (eventsRequest, error) {
	q := r.URL.Query()
	var req eventsRequest
	req.cursor = r.Header.Get("Last-Event-ID")
	for _, name := range []string{"cursor", "lastEventId"} {
		if req.cursor == "" {
			req.cursor = q.Get(name)
		}
	}
	spec := journal.FilterSpec{
		Namespaces:    listParam(q, "namespace"),
		LabelSelector: q.Get("labelSelector"),
		PodUIDs:       listParam(q, "podUID"),
	}
	for _, t := range listParam(q, "type") {
		// The API's enum names or the journal's transition types.
		if v, ok := lifecyclev1.EventType_value[t]; ok {
			if name, ok := server.TransitionType(lifecyclev1.EventType(v)); ok {
				t = name
			}
		}
		spec.EventTypes = append(spec.EventTypes, t)
	}
	for _, f := range listParam(q, "fields") {
		if f != server.FieldIdentity {
			return req, fmt.Errorf("invalid query parameter fields: unknown field %s: want %q", textfmt.Echo(f), server.FieldIdentity)
		}
		spec.Identity, req.identity = true, true
	}
	f, err := journal.NewFilter(spec)
	var fe *journal.FilterError
	if errors.As(err, &fe) {
		return req, fmt.Errorf("invalid query parameter %s %s: %s", queryParams[fe.Field], textfmt.Echo(fe.Value), fe.Reason)
	}
	req.filter = f
	return req, err
}

// events serves the lifecycle stream (docs/stream.md) as Server-Sent
// Events, the same contract as the gRPC Watch: without a cursor, every
// current pod (event "snapshot", one each), then "snapshot-end", then
// "event", "runtime-status" and, when idle, "bookmark"; with a cursor
// (Last-Event-ID, or ?cursor=), exactly the events after it, or one
// "resync-required" and the end of the stream. Every message's data is
// the protojson form of lifecyclev1.WatchResponse, and every message but a
// snapshot's carries its cursor as the SSE id, so that EventSource resumes
// by itself (a snapshot's cursor would skip the rest of the snapshot; the
// resync-required message's empty id makes the reconnection start afresh).
// Query parameters filter as the gRPC Filter does: namespace=, podUID=,
// type= (repeatable or comma-separated), labelSelector=, and fields=identity;
// a bad one is 400 with a message naming it.
//
// An idle stream also carries a ": heartbeat" comment every heartbeat
// interval. pleg drops a stream whose connection takes none of the data
// waiting for it for the stream write timeout (internal/outbox's rule,
// the gRPC streams' too); the reader waits for room in the stream's
// bounded queue, so a reading client is never cut for a burst (a large
// snapshot).
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	req, err := parseEventsRequest(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	select {
	case s.streamSlots <- struct{}{}:
		defer func() { <-s.streamSlots }()
	default:
		w.Header().Set("Retry-After", "10")
		http.Error(w, fmt.Sprintf("too many event streams (at most %d at once)", s.cfg.MaxStreams), http.StatusServiceUnavailable)
		return
	}
	jw, err := s.cfg.Generator.Journal().Watch(req.cursor, req.filter)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	defer jw.Close()

	rc := http.NewResponseController(w)
	// The server's write timeout bounds a response; a stream lasts, and its
	// outbox bounds it instead. (net/http lifts the read deadline itself
	// once the request is read.)
	_ = rc.SetWriteDeadline(time.Time{})

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(s.streams, cancel)
	defer stop()

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)

	ob := outbox.New(outbox.Config[[]byte]{
		Max:          s.cfg.StreamMaxQueuedBytes,
		StallTimeout: s.cfg.StreamWriteTimeout,
		Size:         func(b []byte) int { return len(b) },
		Send: func(b []byte, progress func()) error {
			for first := true; first || len(b) > 0; first = false {
				n := min(len(b), streamChunk)
				if _, err := w.Write(b[:n]); err != nil {
					return err
				}
				if err := rc.Flush(); err != nil {
					return err
				}
				b = b[n:]
				progress()
			}
			return nil
		},
		// A write deadline in the past fails the write in progress and
		// every later one; the handler's context ends its loop.
		Abort: func() {
			cancel()
			_ = rc.SetWriteDeadline(time.Unix(1, 0))
		},
	})
	s.addOutbox(ob)
	defer s.removeOutbox(ob)
	defer ob.Close() // before the handler returns: its sender writes to w

	// The headers, then how soon EventSource should reconnect.
	err = ob.Push(ctx, nil)
	if err == nil {
		err = ob.Push(ctx, []byte("retry: 1000\n\n"))
	}
	for err == nil {
		var msg []byte
		nctx, ncancel := context.WithTimeout(ctx, s.cfg.Heartbeat)
		m, nerr := jw.Next(nctx)
		ncancel()
		switch {
		case nerr == nil:
			if msg = s.encodeEvent(m, req.identity); msg == nil {
				s.cfg.Logger.Error(nil, "Encoding a lifecycle message failed", "type", m.Type.String())
				return
			}
		case errors.Is(nerr, context.DeadlineExceeded) && ctx.Err() == nil:
			msg = []byte(": heartbeat\n\n")
		default: // client gone, dropped, or shutdown
			if err = ob.Err(); err == nil {
				err = nerr
			}
		}
		if msg == nil {
			continue
		}
		// Push waits for room: the journal holds what the client has not
		// taken yet.
		if err = ob.Push(ctx, msg); err == nil && m.Type == journal.ResyncRequired {
			// The stream ends after it, cleanly.
			if err = ob.Drain(ctx); err == nil {
				return
			}
		}
	}
	var drop *outbox.DropError
	if errors.As(err, &drop) {
		s.metrics.streamDrops.WithLabelValues(string(drop.Reason)).Inc()
		s.cfg.Logger.Info("Dropped an event stream client", "remote", r.RemoteAddr, "reason", string(drop.Reason),
			"queuedBytes", drop.Queued, "err", drop.Error())
	} else if err != nil {
		s.cfg.Logger.V(2).Info("Event stream client gone", "remote", r.RemoteAddr, "err", err.Error())
	}
}

// encodeEvent returns one SSE message of m, nil if it cannot be encoded.
// An event's or a runtime status's message depends only on its entry and
// identity: it is encoded once for every stream that sends it.
func (s *Server) encodeEvent(m journal.Message, identity bool) []byte {
	switch m.Type {
	case journal.Event, journal.Runtime:
		b, _ := s.encoded.Get(m.Cursor.Seq, identity, func() ([]byte, bool) {
			b := sseFrame(m, identity)
			return b, b != nil
		})
		return b
	}
	return sseFrame(m, identity)
}

// sseFrame encodes one SSE message of m, nil if it cannot be encoded.
// protojson without Multiline writes no newline, so the data fits on one
// line.
func sseFrame(m journal.Message, identity bool) []byte {
	resp := server.WatchResponse(m, identity)
	if resp == nil {
		return nil
	}
	data, err := protojson.Marshal(resp)
	if err != nil {
		return nil
	}
	var b bytes.Buffer
	b.Grow(len(data) + 64)
	switch m.Type {
	case journal.Snapshot:
		// No id: a reconnection in the middle of the snapshot starts a
		// new one instead of resuming after it.
	case journal.ResyncRequired:
		b.WriteString("id\n") // empty: EventSource reconnects without a cursor
	default:
		b.WriteString("id: ")
		b.WriteString(m.Cursor.String())
		b.WriteByte('\n')
	}
	b.WriteString("event: ")
	b.WriteString(m.Type.String())
	b.WriteString("\ndata: ")
	b.Write(data)
	b.WriteString("\n\n")
	return b.Bytes()
}

// EventTypes are the SSE event types of /api/v1/events.
var EventTypes = []string{"snapshot", "snapshot-end", "event", "bookmark", "runtime-status", "resync-required"}
