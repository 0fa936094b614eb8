package cri

import (
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// BenchmarkDecodeIdleListing decodes the ListContainers reply of a node
// of 1,000 pods of 10 containers that did not change since the previous
// listing, handed over in 16 KiB pieces as gRPC does: the memo's steady
// state.
func BenchmarkDecodeIdleListing(b *testing.B) {
	n := &node{rng: rand.New(rand.NewPCG(1, 1))}
	for range 1000 {
		n.addPod(10)
	}
	reply := &runtimeapi.ListContainersResponse{Containers: n.containers}
	raw, err := marshalOpts(reply)
	if err != nil {
		b.Fatal(err)
	}
	data := pieces(rand.New(rand.NewPCG(2, 2)), raw, 16<<10)
	var m memo
	decode := func() {
		m.begin()
		r := listReply{memo: &m.containers, seed: m.seed, strings: m.strings.begin(), items: m.scratch.containers[:0]}
		if err := decodeListSlice(data, &r); err != nil {
			b.Fatal(err)
		}
		m.scratch.containers = r.items[:0]
		m.containers.commit()
	}
	decode()
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		decode()
	}
	if m.containers.decoded != 0 {
		b.Fatalf("%d items decoded in an idle listing", m.containers.decoded)
	}
}

func marshalOpts(m *runtimeapi.ListContainersResponse) ([]byte, error) {
	return proto.Marshal(m)
}

// BenchmarkDecodeNewListing decodes the same reply as
// BenchmarkDecodeIdleListing into an empty memo: every item is new, and
// decoded, validated, allocated and added (a node's first listing).
func BenchmarkDecodeNewListing(b *testing.B) {
	n := &node{rng: rand.New(rand.NewPCG(1, 1))}
	for range 1000 {
		n.addPod(10)
	}
	raw, err := marshalOpts(&runtimeapi.ListContainersResponse{Containers: n.containers})
	if err != nil {
		b.Fatal(err)
	}
	data := pieces(rand.New(rand.NewPCG(2, 2)), raw, 16<<10)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		var m memo
		m.begin()
		r := listReply{memo: &m.containers, seed: m.seed, strings: m.strings.begin()}
		if err := decodeListSlice(data, &r); err != nil {
			b.Fatal(err)
		}
		m.containers.commit()
		if m.containers.decoded != len(n.containers) {
			b.Fatalf("%d items decoded, want %d", m.containers.decoded, len(n.containers))
		}
	}
}
