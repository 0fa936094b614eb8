package cri

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestListDiscard: the floor call makes the listing's two unfiltered calls
// and counts exactly their replies' bytes, without decoding them; a failed
// call is the call's error.
func TestListDiscard(t *testing.T) {
	n := &node{rng: rand.New(rand.NewPCG(3, 3))}
	for range 12 {
		n.addPod(1 + n.rng.IntN(4))
	}
	f := &fakeCRI{}
	n.serve(f)
	var failing atomic.Bool
	list := f.listContainers
	f.listContainers = func(ctx context.Context, r *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
		if failing.Load() {
			return nil, status.Error(codes.Unavailable, "gone")
		}
		return list(ctx, r)
	}
	c := f.start(t)
	ctx := context.Background()

	sbs, err := c.rs.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	cts, err := c.rs.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := proto.Size(sbs) + proto.Size(cts)
	f.mu.Lock()
	s0, c0 := len(f.sandboxListReqs), len(f.containerListReqs)
	f.mu.Unlock()
	got, err := c.ListDiscard(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got != want || want < 1000 {
		t.Errorf("ListDiscard counted %d bytes, the replies are %d", got, want)
	}
	f.mu.Lock()
	sreqs, creqs := f.sandboxListReqs[s0:], f.containerListReqs[c0:]
	f.mu.Unlock()
	if len(sreqs) != 1 || len(creqs) != 1 || sreqs[0].GetFilter() != nil || creqs[0].GetFilter() != nil {
		t.Errorf("calls made: ListPodSandbox %v, ListContainers %v; want one unfiltered each", sreqs, creqs)
	}

	// WithTimeout(0) disables the timeout, for this call as for the
	// others (it was an expired deadline).
	if got, err := f.start(t, WithTimeout(0)).ListDiscard(ctx); err != nil || got != want {
		t.Errorf("ListDiscard without a timeout = %d, %v; want %d bytes", got, err, want)
	}

	failing.Store(true)
	_, err = c.ListDiscard(ctx)
	var ce *CallError
	if status.Code(err) != codes.Unavailable || !errors.As(err, &ce) || ce.Method != "ListContainers" {
		t.Errorf("ListDiscard with ListContainers failing: %v, want ListContainers' CallError, Unavailable", err)
	}
}
