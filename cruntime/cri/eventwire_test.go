package cri

import (
	"reflect"
	"strconv"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// What one runtime event costs pleg to decode (docs/performance.md, "The
// event stream's decoding"): the standard protobuf decode, which builds the
// whole message, and eventFrom, as the client did before eventReply,
// against decodeEvent, which reads only the fields pleg uses (container
// ID, type, time, the pod) from the wire.
//
//	go test -run XXX -bench EventDecode -count 5 ./cruntime/cri

// kubeletPodEvent is a CONTAINER_STARTED event of a kubelet pod of 5
// containers, as containerd sends it: the pod's sandbox status and every
// container's status, with the kubelet's labels and annotations (3.4 KB).
func kubeletPodEvent() []byte {
	const uid, name, ns = "0f5e7c1a-1111-2222-3333-444455556666", "web-7c9d8f6b5-x2x9z", "default"
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
			Labels: map[string]string{"io.kubernetes.pod.uid": uid, "io.kubernetes.pod.name": name,
				"io.kubernetes.pod.namespace": ns, "app": "web", "pod-template-hash": "7c9d8f6b5"},
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

// TestDecodeKubeletPodEvent: the benchmark's event reads from the wire as
// eventFrom maps it decoded, with the pod's identity; a truncated one is
// an error, not a partial event.
func TestDecodeKubeletPodEvent(t *testing.T) {
	b := kubeletPodEvent()
	var r runtimeapi.ContainerEventResponse
	if err := proto.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	want := eventFrom(&r)
	if want.PodUID == "" || want.PodName == "" || want.ContainerID == "" {
		t.Fatalf("the decoded event lacks its pod or container: %+v", want)
	}
	var lean eventReply
	if err := decodeEvent(mem.BufferSlice{mem.SliceBuffer(b)}, &lean); err != nil || !reflect.DeepEqual(lean.ev, want) {
		t.Errorf("read from the wire: %+v, %v; want %+v", lean.ev, err, want)
	}
	if err := decodeEvent(mem.BufferSlice{mem.SliceBuffer(b[:len(b)-3])}, &lean); err == nil {
		t.Error("a truncated event read as whole")
	}
}

func BenchmarkEventDecode(b *testing.B) {
	ev := kubeletPodEvent()
	b.Run("proto", func(b *testing.B) {
		b.SetBytes(int64(len(ev)))
		b.ReportAllocs()
		for b.Loop() {
			var r runtimeapi.ContainerEventResponse
			if err := proto.Unmarshal(ev, &r); err != nil {
				b.Fatal(err)
			}
			if eventFrom(&r).PodUID == "" {
				b.Fatal("no pod UID")
			}
		}
	})
	b.Run("wire", func(b *testing.B) {
		b.SetBytes(int64(len(ev)))
		b.ReportAllocs()
		data := mem.BufferSlice{mem.SliceBuffer(ev)}
		for b.Loop() {
			var r eventReply
			if err := decodeEvent(data, &r); err != nil || r.ev.PodUID == "" {
				b.Fatalf("%+v, %v", r.ev, err)
			}
		}
	})
}
