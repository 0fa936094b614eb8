package cri

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"testing/iotest"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/cruntime/cri/directlist"
)

// randomReplies builds list replies with every shape grouping cares about:
// missing metadata, empty IDs, unknown states, extra labels and
// annotations, zero values left off the wire.
func randomReplies(rng *rand.Rand, n int) (*runtimeapi.ListPodSandboxResponse, *runtimeapi.ListContainersResponse) {
	sb := &runtimeapi.ListPodSandboxResponse{}
	ct := &runtimeapi.ListContainersResponse{}
	str := func(p string) string {
		if rng.IntN(6) == 0 {
			return ""
		}
		return fmt.Sprintf("%s-%d", p, rng.IntN(50))
	}
	for range n {
		s := &runtimeapi.PodSandbox{Id: str("sb"), State: runtimeapi.PodSandboxState(rng.IntN(4)),
			CreatedAt: rng.Int64N(1 << 40), Labels: map[string]string{"a": str("x"), cruntime.LabelPodUID: str("u")},
			Annotations: map[string]string{"k": str("v")}, RuntimeHandler: str("h")}
		if rng.IntN(5) != 0 {
			s.Metadata = &runtimeapi.PodSandboxMetadata{Name: str("pod"), Uid: str("uid"), Namespace: str("ns"), Attempt: uint32(rng.IntN(3))}
		}
		sb.Items = append(sb.Items, s)
		c := &runtimeapi.Container{Id: str("c"), PodSandboxId: str("sb"), State: runtimeapi.ContainerState(rng.IntN(6)),
			CreatedAt: rng.Int64N(1 << 40), ImageRef: str("ref"), ImageId: str("id"),
			Annotations: map[string]string{"io.kubernetes.container.hash": str("h")}}
		if rng.IntN(5) != 0 {
			c.Metadata = &runtimeapi.ContainerMetadata{Name: str("name"), Attempt: uint32(rng.IntN(3))}
		}
		if rng.IntN(4) != 0 {
			c.Image = &runtimeapi.ImageSpec{Image: str("img"), Annotations: map[string]string{"a": "b"}}
		}
		if rng.IntN(6) != 0 {
			c.Labels = map[string]string{
				cruntime.LabelPodUID: str("uid"), cruntime.LabelPodName: str("pod"),
				cruntime.LabelPodNamespace: str("ns"), cruntime.LabelContainerName: str("cn"), "other": str("o"),
			}
		}
		ct.Containers = append(ct.Containers, c)
	}
	return sb, ct
}

// The wire decoder reads exactly what the generated code would.
func TestWireDecodeMatchesProto(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	in := &interner{}
	for round := range 50 {
		sb, ct := randomReplies(rng, round+1)
		sbBytes, _ := proto.Marshal(sb)
		ctBytes, _ := proto.Marshal(ct)
		tbl := in.begin()
		gotSB := listReply{sandboxes: true, strings: tbl}
		gotCT := listReply{strings: tbl}
		if err := decodeList(sbBytes, &gotSB); err != nil {
			t.Fatal(err)
		}
		if err := decodeList(ctBytes, &gotCT); err != nil {
			t.Fatal(err)
		}
		in.end(tbl)
		// Only the items that can be grouped are kept.
		var wantSB, wantCT []listed
		for _, s := range sb.Items {
			if it := sandboxItem(s); skipped(len(it.ID), it.meta, len(it.uid)) == skipNone {
				wantSB = append(wantSB, it)
			}
		}
		for _, c := range ct.Containers {
			if it := containerItem(c); skipped(len(it.ID), it.meta, len(it.uid)) == skipNone {
				wantCT = append(wantCT, it)
			}
		}
		if got := decoded(t, gotSB.items); !reflect.DeepEqual(got, wantSB) {
			t.Fatalf("round %d sandboxes\n got %+v\nwant %+v", round, got, wantSB)
		}
		if got := decoded(t, gotCT.items); !reflect.DeepEqual(got, wantCT) {
			t.Fatalf("round %d containers\n got %+v\nwant %+v", round, got, wantCT)
		}
	}
}

// Strings of the previous reply are reused, not allocated again, from
// internMin bytes on (IDs, pod UIDs, image names).
func TestWireDecodeReusesStrings(t *testing.T) {
	ct := &runtimeapi.ListContainersResponse{}
	for i := range 200 {
		uid := fmt.Sprintf("3f1c6a2e-0c41-4d8e-9a51-%012d", i/4)
		ct.Containers = append(ct.Containers, &runtimeapi.Container{
			Id:       fmt.Sprintf("%064x", i),
			Metadata: &runtimeapi.ContainerMetadata{Name: fmt.Sprintf("container-name-%04d", i%4)},
			Image:    &runtimeapi.ImageSpec{Image: "registry.k8s.io/e2e-test-images/agnhost:2.53"},
			State:    runtimeapi.ContainerState_CONTAINER_RUNNING,
			Labels:   label(uid, "pod-name-"+uid, "namespace-of-the-pods", ""),
		})
	}
	b, _ := proto.Marshal(ct)
	in := &interner{}
	decode := func() {
		tbl := in.begin()
		r := listReply{strings: tbl}
		if err := decodeList(b, &r); err != nil {
			t.Fatal(err)
		}
		if len(r.items) != 200 {
			t.Fatalf("%d items decoded, want 200", len(r.items))
		}
		in.end(tbl)
	}
	decode()
	decode()
	allocs := testing.AllocsPerRun(20, decode)
	// The item slice grows and the next table is built, but no string is
	// allocated: far fewer allocations than the 200 items' strings.
	if allocs > 60 {
		t.Fatalf("%.0f allocations per decode of 200 containers", allocs)
	}
}

// pieces cuts b at random points, as gRPC hands a reply over in frames.
func pieces(rng *rand.Rand, b []byte, maxPiece int) mem.BufferSlice {
	var out mem.BufferSlice
	for len(b) > 0 {
		n := min(len(b), 1+rng.IntN(maxPiece))
		out = append(out, mem.SliceBuffer(b[:n]))
		b = b[n:]
	}
	return out
}

// A reply in pieces decodes as the same reply in one buffer, wherever the
// cuts fall: inside tags, lengths and items.
func TestWireDecodePieces(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for round := range 40 {
		sb, ct := randomReplies(rng, 1+round)
		for _, msg := range []struct {
			b         []byte
			sandboxes bool
		}{{marshal(t, sb), true}, {marshal(t, ct), false}} {
			whole := listReply{sandboxes: msg.sandboxes, strings: (&interner{}).begin()}
			if err := decodeList(msg.b, &whole); err != nil {
				t.Fatal(err)
			}
			for _, maxPiece := range []int{1, 3, 17, 200} {
				cut := listReply{sandboxes: msg.sandboxes, strings: (&interner{}).begin()}
				if err := decodeListSlice(pieces(rng, msg.b, maxPiece), &cut); err != nil {
					t.Fatalf("round %d, pieces of at most %d: %v", round, maxPiece, err)
				}
				if !reflect.DeepEqual(cut.items, whole.items) {
					t.Fatalf("round %d, pieces of at most %d: items differ", round, maxPiece)
				}
			}
			for _, bufSize := range []int{16, 100, 64 << 10} {
				got := listReply{sandboxes: msg.sandboxes, strings: (&interner{}).begin()}
				if err := decodeStreamed(msg.b, bufSize, &got); err != nil {
					t.Fatalf("round %d, as it arrives, read buffer %d: %v", round, bufSize, err)
				}
				if !reflect.DeepEqual(got.items, whole.items) {
					t.Fatalf("round %d, as it arrives, read buffer %d: items differ", round, bufSize)
				}
			}
		}
	}
	// Truncated anywhere: an error, in pieces as in one buffer.
	_, ct := randomReplies(rng, 3)
	b := marshal(t, ct)
	for n := 1; n < len(b); n++ {
		r := listReply{strings: (&interner{}).begin()}
		errWhole := decodeList(b[:n], &r)
		r = listReply{strings: (&interner{}).begin()}
		errCut := decodeListSlice(pieces(rng, b[:n], 5), &r)
		if (errWhole == nil) != (errCut == nil) {
			t.Fatalf("truncated at %d: whole %v, in pieces %v", n, errWhole, errCut)
		}
		r = listReply{strings: (&interner{}).begin()}
		if err := decodeStreamed(b[:n], 16, &r); (errWhole == nil) != (err == nil) {
			t.Fatalf("truncated at %d: whole %v, as it arrives %v", n, errWhole, err)
		}
		// A body that ends before the length its prefix gave: the read's
		// error, not a malformed message.
		r = listReply{strings: (&interner{}).begin()}
		m := directlist.NewMessage(bufio.NewReaderSize(iotest.HalfReader(bytes.NewReader(b[:n])), 16), len(b))
		if err := decodeListFrom(m, &r); err == nil || !errors.Is(m.Err(), io.ErrUnexpectedEOF) {
			t.Fatalf("body cut at %d of %d: decode %v, read error %v; want a failed decode and io.ErrUnexpectedEOF", n, len(b), err, m.Err())
		}
	}
}

// decodeStreamed decodes the list reply b as it arrives from a body, a few
// bytes a read, through a read buffer of bufSize bytes (at least 16).
func decodeStreamed(b []byte, bufSize int, r *listReply) error {
	m := directlist.NewMessage(bufio.NewReaderSize(iotest.HalfReader(bytes.NewReader(b)), bufSize), len(b))
	err := decodeListFrom(m, r)
	if m.Err() != nil {
		return m.Err()
	}
	return err
}

func marshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// decoded returns the items a decode without the memo made, which are all
// fresh.
func decoded(t *testing.T, items []itemRef) []listed {
	t.Helper()
	var out []listed
	for _, it := range items {
		if it.reused {
			t.Errorf("item %s marked reused without a memo", it.ID)
		}
		out = append(out, *it.listed)
	}
	return out
}

// TestWireDecodeEdges: encodings at the edges of the wire format are
// accepted or rejected as the generated code does.
func TestWireDecodeEdges(t *testing.T) {
	item := str(nil, fieldContainerID, "c")
	item = msg(item, fieldContainerMetadata, str(nil, fieldContainerMetaName, "n"))
	item = msg(item, fieldContainerLabels, labelEntry(cruntime.LabelPodUID, "u"))
	group := func(num protowire.Number, inner []byte) []byte {
		return tag(append(tag(nil, num, protowire.StartGroupType), inner...), num, protowire.EndGroupType)
	}
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"an unknown group before the items", append(group(7, varint(nil, 3, 1)), msg(nil, fieldListItems, item)...)},
		{"unknown groups nested", append(group(7, group(8, group(9, nil))), msg(nil, fieldListItems, item)...)},
		{"a group's end of another number", tag(tag(nil, 7, protowire.StartGroupType), 8, protowire.EndGroupType)},
		{"an end of group alone", tag(nil, 7, protowire.EndGroupType)},
		{"an unterminated group", tag(nil, 7, protowire.StartGroupType)},
		{"the largest field number", append(varint(nil, protowire.MaxValidNumber, 1), msg(nil, fieldListItems, item)...)},
		{"a field number too large", append(varint(nil, protowire.MaxValidNumber+1, 1), msg(nil, fieldListItems, item)...)},
		{"a field number too large in an item", msg(nil, fieldListItems, varint(slices.Clone(item), protowire.MaxValidNumber+1, 1))},
		{"a group in an item", msg(nil, fieldListItems, append(slices.Clone(item), group(12, varint(nil, 1, 1))...))},
		{"a reserved wire type", []byte{0x0e}},
		{"items with the wrong wire type", append(varint(nil, fieldListItems, 1), msg(nil, fieldListItems, item)...)},
		{"an item of fixed32 type", append(protowire.AppendFixed32(tag(nil, fieldListItems, protowire.Fixed32Type), 1), msg(nil, fieldListItems, item)...)},
	} {
		var want runtimeapi.ListContainersResponse
		wantErr := proto.Unmarshal(tc.b, &want)
		for _, maxPiece := range []int{1, 2, 1 << 20} {
			r := listReply{strings: (&interner{}).begin()}
			err := decodeListSlice(pieces(rand.New(rand.NewPCG(1, 1)), tc.b, maxPiece), &r)
			if (err == nil) != (wantErr == nil) || (err != nil && !errors.Is(err, errMalformed)) {
				t.Errorf("%s, pieces of %d: error %v, the generated code's %v", tc.name, maxPiece, err, wantErr)
				continue
			}
			if err == nil && len(r.items) != len(want.Containers) {
				t.Errorf("%s, pieces of %d: %d items, the generated code %d", tc.name, maxPiece, len(r.items), len(want.Containers))
			}
		}
	}
}
