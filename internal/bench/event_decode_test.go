package bench

import (
	"strconv"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// What one runtime event costs pleg to decode (docs/performance.md, "What
// misses its goal"): the standard protobuf decode cri.Client.WatchEvents
// does, which builds the whole message, against reading from the wire only
// the fields pleg uses (container ID, type, time, the pod's metadata).
//
//	go test -run XXX -bench EventDecode -count 5 ./internal/bench

// podEvent is a CONTAINER_STARTED event of a kubelet pod of 5 containers,
// as containerd sends it: the pod's sandbox status and every container's
// status, with the kubelet's labels and annotations.
func podEvent() []byte {
	const uid, name, ns = "0f5e7c1a-1111-2222-3333-444455556666", "web-7c9d8f6b5-x2x9z", "default"
	podLabels := map[string]string{"io.kubernetes.pod.uid": uid, "io.kubernetes.pod.name": name,
		"io.kubernetes.pod.namespace": ns, "app": "web", "pod-template-hash": "7c9d8f6b5"}
	r := &runtimeapi.ContainerEventResponse{
		ContainerId:        "a3f9c1d2e4b5a6978877665544332211a3f9c1d2e4b5a6978877665544332211",
		ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT,
		CreatedAt:          1764064800000000000,
		PodSandboxStatus: &runtimeapi.PodSandboxStatus{
			Id:        "b3f9c1d2e4b5a6978877665544332211a3f9c1d2e4b5a6978877665544332211",
			Metadata:  &runtimeapi.PodSandboxMetadata{Name: name, Uid: uid, Namespace: ns},
			State:     runtimeapi.PodSandboxState_SANDBOX_READY,
			CreatedAt: 1764064700000000000,
			Network:   &runtimeapi.PodSandboxNetworkStatus{Ip: "10.244.1.17"},
			Labels:    podLabels,
			Annotations: map[string]string{"kubernetes.io/config.seen": "2026-11-25T10:00:00.000000000Z",
				"kubernetes.io/config.source": "api"},
		},
	}
	for i := range 5 {
		c := "c" + strconv.Itoa(i)
		r.ContainersStatuses = append(r.ContainersStatuses, &runtimeapi.ContainerStatus{
			Id:        "c3f9c1d2e4b5a6978877665544332211a3f9c1d2e4b5a69788776655443322" + strconv.Itoa(10+i),
			Metadata:  &runtimeapi.ContainerMetadata{Name: c, Attempt: 1},
			State:     runtimeapi.ContainerState_CONTAINER_RUNNING,
			CreatedAt: 1764064700000000000, StartedAt: 1764064700000000000,
			Image:    &runtimeapi.ImageSpec{Image: "registry.k8s.io/app:1.0"},
			ImageRef: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			Labels: map[string]string{"io.kubernetes.container.name": c, "io.kubernetes.pod.uid": uid,
				"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": ns},
			Annotations: map[string]string{"io.kubernetes.container.hash": "abcd1234", "io.kubernetes.container.restartCount": "1",
				"io.kubernetes.container.terminationMessagePath": "/dev/termination-log"},
			LogPath: "/var/log/pods/default_web/" + c + "/1.log",
		})
	}
	b, err := proto.Marshal(r)
	if err != nil {
		panic(err)
	}
	return b
}

// eventFields are the fields of an event pleg uses.
type eventFields struct {
	id, uid, name, namespace string
	typ                      runtimeapi.ContainerEventType
	createdAt                int64
}

// readEventFields reads them from the wire, skipping everything else
// (container statuses, maps). It returns false on malformed input.
func readEventFields(b []byte) (ev eventFields, ok bool) {
	ok = eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, n uint64) bool {
		switch {
		case num == 1 && typ == protowire.BytesType:
			ev.id = string(v)
		case num == 2 && typ == protowire.VarintType:
			ev.typ = runtimeapi.ContainerEventType(n)
		case num == 3 && typ == protowire.VarintType:
			ev.createdAt = int64(n)
		case num == 4 && typ == protowire.BytesType: // the pod sandbox status
			return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) bool {
				if num != 2 || typ != protowire.BytesType { // its metadata
					return true
				}
				return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) bool {
					switch {
					case num == 1 && typ == protowire.BytesType:
						ev.name = string(v)
					case num == 2 && typ == protowire.BytesType:
						ev.uid = string(v)
					case num == 3 && typ == protowire.BytesType:
						ev.namespace = string(v)
					}
					return true
				})
			})
		}
		return true
	})
	return ev, ok
}

// eachField calls fn with each field of a message: its bytes if length
// delimited, its value if a varint.
func eachField(b []byte, fn func(protowire.Number, protowire.Type, []byte, uint64) bool) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 || !fn(num, typ, v, x) {
			return false
		}
		b = b[n:]
	}
	return true
}

func TestReadEventFields(t *testing.T) {
	b := podEvent()
	var r runtimeapi.ContainerEventResponse
	if err := proto.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	md := r.PodSandboxStatus.Metadata
	want := eventFields{id: r.ContainerId, uid: md.Uid, name: md.Name, namespace: md.Namespace, typ: r.ContainerEventType, createdAt: r.CreatedAt}
	if got, ok := readEventFields(b); !ok || got != want {
		t.Errorf("read %+v (%v), want %+v", got, ok, want)
	}
	if _, ok := readEventFields(b[:len(b)-3]); ok {
		t.Error("a truncated event read as whole")
	}
}

func BenchmarkEventDecode(b *testing.B) {
	ev := podEvent()
	b.Run("proto", func(b *testing.B) {
		b.SetBytes(int64(len(ev)))
		b.ReportAllocs()
		for b.Loop() {
			var r runtimeapi.ContainerEventResponse
			if err := proto.Unmarshal(ev, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("wire", func(b *testing.B) {
		b.SetBytes(int64(len(ev)))
		b.ReportAllocs()
		for b.Loop() {
			if f, ok := readEventFields(ev); !ok || f.uid == "" {
				b.Fatal("no pod UID")
			}
		}
	})
}
