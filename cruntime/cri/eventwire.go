package cri

import (
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
)

// A runtime container event (ContainerEventResponse) carries the pod's
// sandbox status and the full status of the pod's containers, with their
// labels and annotations; pleg reads four things of it: the container's
// ID, the event's type and time, and the pod. eventReply is the lean
// codec's target for it: those fields are read from the wire, nothing
// else is built (the standard decoder builds the whole message, some 300
// allocations for a kubelet pod's event: docs/performance.md).
type eventReply struct {
	ev cruntime.Event
}

// The field numbers, read from the generated descriptors once.
var eventFields = func() (f struct {
	containerID, eventType, createdAt, sandboxStatus, containerStatuses protowire.Number
	sandboxMetadata, metaName, metaUID, metaNamespace                   protowire.Number
	statusLabels                                                        protowire.Number
}) {
	num := func(d protoreflect.MessageDescriptor, name protoreflect.Name) protowire.Number {
		return d.Fields().ByName(name).Number()
	}
	e := (&runtimeapi.ContainerEventResponse{}).ProtoReflect().Descriptor()
	f.containerID, f.eventType, f.createdAt = num(e, "container_id"), num(e, "container_event_type"), num(e, "created_at")
	f.sandboxStatus, f.containerStatuses = num(e, "pod_sandbox_status"), num(e, "containers_statuses")
	s := (&runtimeapi.PodSandboxStatus{}).ProtoReflect().Descriptor()
	f.sandboxMetadata = num(s, "metadata")
	m := (&runtimeapi.PodSandboxMetadata{}).ProtoReflect().Descriptor()
	f.metaName, f.metaUID, f.metaNamespace = num(m, "name"), num(m, "uid"), num(m, "namespace")
	f.statusLabels = num((&runtimeapi.ContainerStatus{}).ProtoReflect().Descriptor(), "labels")
	return f
}()

// decodeEvent reads one event from data as eventFrom maps the decoded
// message: the pod from the sandbox status's metadata, else from the first
// container status's labels.
func decodeEvent(data mem.BufferSlice, r *eventReply) error {
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	f := &eventFields
	var id, uid, name, ns []byte
	var labelUID, labelName, labelNS []byte
	var typ int32
	var created int64
	firstStatus := true
	err := walk(b, func(num protowire.Number, v []byte, x uint64, varint bool) error {
		switch {
		case num == f.containerID && !varint:
			id = v
		case num == f.eventType && varint:
			typ = int32(x)
		case num == f.createdAt && varint:
			created = int64(x)
		case num == f.sandboxStatus && !varint:
			return walk(v, func(num protowire.Number, v []byte, _ uint64, varint bool) error {
				if num != f.sandboxMetadata || varint {
					return nil
				}
				return walk(v, func(num protowire.Number, v []byte, _ uint64, varint bool) error {
					switch {
					case num == f.metaName && !varint:
						name = v
					case num == f.metaUID && !varint:
						uid = v
					case num == f.metaNamespace && !varint:
						ns = v
					}
					return nil
				})
			})
		case num == f.containerStatuses && !varint:
			if !firstStatus {
				return nil
			}
			firstStatus = false
			return walk(v, func(num protowire.Number, v []byte, _ uint64, varint bool) error {
				if num != f.statusLabels || varint {
					return nil
				}
				var w wireItem
				if err := w.readLabel(v); err != nil {
					return err
				}
				if w.uid != nil {
					labelUID = w.uid
				}
				if w.podName != nil {
					labelName = w.podName
				}
				if w.podNamespace != nil {
					labelNS = w.podNamespace
				}
				return nil
			})
		}
		return nil
	})
	if err != nil {
		return err
	}
	ev := cruntime.Event{ContainerID: string(id), Type: eventType(runtimeapi.ContainerEventType(typ)), CreatedAt: nsTime(created)}
	if len(uid) > 0 {
		ev.PodUID, ev.PodName, ev.PodNamespace = types.UID(uid), string(name), string(ns)
	} else if len(labelUID) > 0 {
		ev.PodUID, ev.PodName, ev.PodNamespace = types.UID(labelUID), string(labelName), string(labelNS)
	}
	r.ev = ev
	return nil
}
