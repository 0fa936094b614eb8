package server

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/internal/textfmt"
	"github.com/podlifecycle/pleg/journal"
)

// eventTypes maps the API's event types to the journal's transition types.
var eventTypes = map[lifecyclev1.EventType]string{
	lifecyclev1.EventType_CONTAINER_STARTED: "ContainerStarted",
	lifecyclev1.EventType_CONTAINER_DIED:    "ContainerDied",
	lifecyclev1.EventType_CONTAINER_REMOVED: "ContainerRemoved",
	lifecyclev1.EventType_POD_SYNC:          "PodSync",
	lifecyclev1.EventType_POD_UPDATED:       journal.PodUpdated,
}

// TransitionType returns the journal's transition type of an API event
// type (false: EVENT_TYPE_UNSPECIFIED or unknown).
func TransitionType(t lifecyclev1.EventType) (string, bool) {
	name, ok := eventTypes[t]
	return name, ok
}

// transitionTypes is eventTypes reversed.
var transitionTypes = func() map[string]lifecyclev1.EventType {
	m := make(map[string]lifecyclev1.EventType, len(eventTypes))
	for k, v := range eventTypes {
		m[v] = k
	}
	return m
}()

// FieldIdentity is the WatchRequest field that asks for identities.
const FieldIdentity = "identity"

// filterFieldNames are the API's names of the journal's filter fields.
var filterFieldNames = map[string]string{
	"namespaces":    "filter.namespaces",
	"labelSelector": "filter.label_selector",
	"podUIDs":       "filter.pod_uids",
	"eventTypes":    "filter.event_types",
}

// FilterSpec converts an API filter and field mask to the journal's. A
// bad event type or field is a *journal.FilterError ("eventTypes") or a
// *FieldError.
func FilterSpec(f *lifecyclev1.Filter, fields []string) (journal.FilterSpec, error) {
	spec := journal.FilterSpec{
		Namespaces:    f.GetNamespaces(),
		LabelSelector: f.GetLabelSelector(),
		PodUIDs:       f.GetPodUids(),
	}
	for _, t := range f.GetEventTypes() {
		name, ok := eventTypes[t]
		if !ok {
			return spec, &journal.FilterError{Field: "eventTypes", Value: t.String(),
				Reason: "want CONTAINER_STARTED, CONTAINER_DIED, CONTAINER_REMOVED, POD_SYNC or POD_UPDATED"}
		}
		spec.EventTypes = append(spec.EventTypes, name)
	}
	for _, fl := range fields {
		if fl != FieldIdentity {
			return spec, &FieldError{Field: fl}
		}
		spec.Identity = true
	}
	return spec, nil
}

// FieldError is an unknown optional field asked for.
type FieldError struct{ Field string }

func (e *FieldError) Error() string {
	return fmt.Sprintf("invalid fields: unknown field %s: want %q", textfmt.Echo(e.Field), FieldIdentity)
}

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func state(s cruntime.State) lifecyclev1.State {
	switch s {
	case cruntime.StateCreated:
		return lifecyclev1.State_STATE_CREATED
	case cruntime.StateRunning:
		return lifecyclev1.State_STATE_RUNNING
	case cruntime.StateExited:
		return lifecyclev1.State_STATE_EXITED
	}
	return lifecyclev1.State_STATE_UNKNOWN
}

// podMessage converts a journal pod; identity says whether containers' identities
// are included.
func podMessage(p *journal.Pod, identity bool) *lifecyclev1.Pod {
	if p == nil {
		return nil
	}
	out := &lifecyclev1.Pod{
		Uid: string(p.UID), Name: p.Name, Namespace: p.Namespace, Ips: p.IPs,
		Labels: p.Labels.Map(), Annotations: p.Annotations.Map(), Gone: p.Gone, ObservedAt: timestamp(p.ObservedAt),
	}
	if len(p.Sandboxes) > 0 {
		out.Sandboxes = make([]*lifecyclev1.Sandbox, len(p.Sandboxes))
		for i := range p.Sandboxes {
			out.Sandboxes[i] = sandbox(p.Sandboxes[i])
		}
	}
	if len(p.Containers) > 0 {
		out.Containers = make([]*lifecyclev1.Container, len(p.Containers))
		for i := range p.Containers {
			out.Containers[i] = container(p.Containers[i], identity)
		}
	}
	return out
}

func sandbox(s *journal.Sandbox) *lifecyclev1.Sandbox {
	return &lifecyclev1.Sandbox{Id: s.ID, State: state(s.State), Attempt: s.Attempt, CreatedAt: timestamp(s.CreatedAt),
		Ips: s.IPs, HostNetwork: s.HostNetwork, Labels: s.Labels.Map(), Annotations: s.Annotations.Map()}
}

func container(c *journal.Container, identity bool) *lifecyclev1.Container {
	out := &lifecyclev1.Container{Id: c.ID, Name: c.Name, State: state(c.State), Attempt: c.Attempt,
		Image: c.Image, ImageRef: c.ImageRef(), CreatedAt: timestamp(c.CreatedAt()), StartedAt: timestamp(c.StartedAt()),
		FinishedAt: timestamp(c.FinishedAt()), Reason: c.Reason(), Message: c.Message(),
		Labels: c.Labels().Map(), Annotations: c.Annotations().Map()}
	if code, ok := c.ExitCode(); ok {
		out.ExitCode = &code
	}
	if identity && c.Identity != nil {
		out.Identity = &lifecyclev1.Identity{Pid: c.Identity.PID, CgroupPath: c.Identity.CgroupPath}
	}
	return out
}

func source(s journal.Source) lifecyclev1.Source {
	switch s {
	case journal.SourceRelist:
		return lifecyclev1.Source_SOURCE_RELIST
	case journal.SourceHint:
		return lifecyclev1.Source_SOURCE_HINT
	}
	return lifecyclev1.Source_SOURCE_UNSPECIFIED
}

func runtimeState(s journal.RuntimeState) lifecyclev1.RuntimeState {
	switch s {
	case journal.RuntimeReachable:
		return lifecyclev1.RuntimeState_RUNTIME_REACHABLE
	case journal.RuntimeUnreachable:
		return lifecyclev1.RuntimeState_RUNTIME_UNREACHABLE
	case journal.RuntimeEventStreamLost:
		return lifecyclev1.RuntimeState_RUNTIME_EVENT_STREAM_LOST
	case journal.RuntimeEventStreamConnected:
		return lifecyclev1.RuntimeState_RUNTIME_EVENT_STREAM_CONNECTED
	}
	return lifecyclev1.RuntimeState_RUNTIME_STATE_UNSPECIFIED
}

// WatchResponse converts a watcher's message; identity says whether
// containers' identities are included. A message of an unknown type gives
// nil.
func WatchResponse(m journal.Message, identity bool) *lifecyclev1.WatchResponse {
	r := &lifecyclev1.WatchResponse{Cursor: m.Cursor.String(), Time: timestamp(m.Time)}
	switch m.Type {
	case journal.Snapshot:
		r.Message = &lifecyclev1.WatchResponse_Snapshot{Snapshot: podMessage(m.Pod, identity)}
	case journal.SnapshotEnd:
		r.Message = &lifecyclev1.WatchResponse_SnapshotEnd{SnapshotEnd: &lifecyclev1.SnapshotEnd{}}
	case journal.Event:
		ev := &lifecyclev1.PodEvent{Pod: podMessage(m.Pod, identity), Source: source(m.Source),
			Transitions: make([]*lifecyclev1.Transition, len(m.Transitions))}
		for i, t := range m.Transitions {
			ev.Transitions[i] = &lifecyclev1.Transition{Type: transitionTypes[t.Type], ContainerId: t.ContainerID,
				ContainerName: t.ContainerName, Sandbox: t.Sandbox, ExitCode: t.ExitCode}
		}
		r.Message = &lifecyclev1.WatchResponse_Event{Event: ev}
	case journal.Bookmark:
		r.Message = &lifecyclev1.WatchResponse_Bookmark{Bookmark: &lifecyclev1.Bookmark{}}
	case journal.Runtime:
		rs := &lifecyclev1.RuntimeStatus{}
		if m.Runtime != nil {
			rs.State, rs.Message = runtimeState(m.Runtime.State), m.Runtime.Message
		}
		r.Message = &lifecyclev1.WatchResponse_RuntimeStatus{RuntimeStatus: rs}
	case journal.ResyncRequired:
		r.Message = &lifecyclev1.WatchResponse_ResyncRequired{ResyncRequired: &lifecyclev1.ResyncRequired{Reason: m.Reason}}
	default:
		return nil
	}
	return r
}

// containerResponse converts a container lookup.
func containerResponse(f journal.Found) *lifecyclev1.GetContainerResponse {
	r := &lifecyclev1.GetContainerResponse{Pod: podMessage(f.Pod, true), Removed: f.Removed}
	if f.Removed {
		r.RemovedAt = timestamp(f.RemovedAt)
	}
	if f.Container != nil {
		r.Container = container(f.Container, true)
	}
	if f.Sandbox != nil {
		r.Sandbox = sandbox(f.Sandbox)
	}
	return r
}
