package criserve

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/cruntime/sim"
	"github.com/podlifecycle/pleg/journal"
)

// verbosePID is the pid of a verbose ContainerStatus's info.
func verbosePID(t *testing.T, r *runtimeapi.ContainerStatusResponse) int64 {
	t.Helper()
	var v struct {
		PID int64 `json:"pid"`
	}
	if err := json.Unmarshal([]byte(r.GetInfo()["info"]), &v); err != nil {
		t.Fatalf("verbose info %q: %v", r.GetInfo()["info"], err)
	}
	return v.PID
}

// TestVerboseFromRelist: with the store (pleg run with a CRI endpoint),
// pleg's relist makes its status calls verbose and the endpoint answers
// its clients' verbose statuses from them, the runtime's own answers, with
// no runtime call; after a container's state changes, the answer is the
// runtime's after the change (the exited container's PID is gone).
func TestVerboseFromRelist(t *testing.T) {
	store := NewVerboseStore(0)
	r := newRig(t, sim.Config{Seed: 5, Pods: 3, ContainersPerPod: 2}, Config{Verbose: store})
	r.synced(t)
	m := r.srv.cfg.Metrics
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	check := func(id string) *runtimeapi.ContainerStatusResponse {
		t.Helper()
		got, err := r.pleg.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
		if err != nil {
			t.Fatal(err)
		}
		want, err := r.direct.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, want) {
			t.Errorf("verbose ContainerStatus of %s through pleg %v, straight %v", id, got, want)
		}
		return got
	}
	pods := r.sim.Pods()
	for _, p := range pods {
		for _, c := range p.Containers {
			check(c.ID)
		}
	}
	if n := testutil.CollectAndCount(m.runtime); n != 0 {
		t.Errorf("verbose statuses of items pleg inspected reached the runtime: %d series of pleg_cri_runtime_calls_total", n)
	}
	if n, b := store.size(); n != 3*2 || b <= 0 {
		t.Errorf("the store keeps %d answers (%d bytes), want the 6 containers'", n, b)
	}

	// The running container exits: its kept answer (with its PID) is no
	// longer served; once pleg saw the exit, the answer is the runtime's
	// after it, still with no runtime call.
	old := pods[0].Containers[0].ID
	if verbosePID(t, check(old)) == 0 {
		t.Fatalf("a running container's verbose info has no PID")
	}
	if err := r.sim.ExitContainer(old, 3); err != nil {
		t.Fatal(err)
	}
	r.synced(t)
	if got := check(old); got.GetStatus().GetState() != runtimeapi.ContainerState_CONTAINER_EXITED || verbosePID(t, got) != 0 {
		t.Errorf("after its exit, the container's verbose status through pleg is %v", got)
	}
	if n := testutil.CollectAndCount(m.runtime); n != 0 {
		t.Errorf("a verbose status after a change pleg saw reached the runtime: %d series of pleg_cri_runtime_calls_total", n)
	}
}

// TestVerboseStoreRules: an answer is served only in the state it was got
// in; an unknown state is not kept; the bytes are bounded, the answers of
// items the journal no longer has going first, then the oldest; a later
// answer replaces an item's earlier one.
func TestVerboseStoreRules(t *testing.T) {
	resp := func(id string, st runtimeapi.ContainerState, pad int) *runtimeapi.ContainerStatusResponse {
		return &runtimeapi.ContainerStatusResponse{
			Status: &runtimeapi.ContainerStatus{Id: id, State: st},
			Info:   map[string]string{"info": strings.Repeat("x", pad)},
		}
	}
	size := int64(proto.Size(resp("c0", runtimeapi.ContainerState_CONTAINER_RUNNING, 1000)))
	v := NewVerboseStore(4 * size)

	v.ContainerVerbose("c0", cruntime.StateRunning, resp("c0", runtimeapi.ContainerState_CONTAINER_RUNNING, 1000))
	if _, ok := v.get("ContainerStatus", "c0", cruntime.StateRunning); !ok {
		t.Error("a kept answer is not served in its state")
	}
	if _, ok := v.get("ContainerStatus", "c0", cruntime.StateExited); ok {
		t.Error("an answer got while running is served for the exited container")
	}
	if _, ok := v.get("PodSandboxStatus", "c0", cruntime.StateRunning); ok {
		t.Error("a ContainerStatus answer is served as a PodSandboxStatus")
	}
	v.ContainerVerbose("c0", cruntime.StateExited, resp("c0", runtimeapi.ContainerState_CONTAINER_EXITED, 1000))
	if _, ok := v.get("ContainerStatus", "c0", cruntime.StateRunning); ok {
		t.Error("the answer of an earlier state is kept beside the newer")
	}
	if n, b := v.size(); n != 1 || b != size {
		t.Errorf("one item's answers: %d kept, %d bytes; want 1, %d", n, b, size)
	}
	v.ContainerVerbose("u", cruntime.StateUnknown, resp("u", runtimeapi.ContainerState_CONTAINER_UNKNOWN, 10))
	if _, ok := v.get("ContainerStatus", "u", cruntime.StateUnknown); ok {
		t.Error("an answer in the unknown state is kept")
	}

	// The journal has c0 and c2..c5, not c1. c1's answer is spared by
	// the first pruning after it was kept (its item may be on its way to
	// the journal), dropped by the next; past the bound, it goes before
	// the live items' answers, then the oldest go.
	j := journal.New(journal.Options{Epoch: "e"})
	var cs []*journal.Container
	for _, id := range []string{"c0", "c2", "c3", "c4", "c5"} {
		cs = append(cs, &journal.Container{ID: id, State: cruntime.StateRunning})
	}
	j.Append(journal.Entry{Kind: journal.KindPod, Pod: &journal.Pod{UID: "p", Containers: cs}, Source: journal.SourceRelist})
	running := func(v *VerboseStore, id string) {
		v.ContainerVerbose(id, cruntime.StateRunning, resp(id, runtimeapi.ContainerState_CONTAINER_RUNNING, 1000))
	}
	kept := func(v *VerboseStore, id string) bool {
		_, ok := v.get("ContainerStatus", id, cruntime.StateRunning)
		return ok
	}
	big := NewVerboseStore(0)
	big.watch(j)
	running(big, "c1")
	for range verbosePruneEvery - 1 { // the 64th answer prunes
		running(big, "c2")
	}
	if !kept(big, "c1") {
		t.Error("the first pruning after an answer was kept dropped it")
	}
	for range verbosePruneEvery {
		running(big, "c2")
	}
	if kept(big, "c1") {
		t.Error("the second pruning after an answer of an item the journal does not have kept it")
	}
	if !kept(big, "c2") {
		t.Error("a pruning dropped a live item's answer")
	}

	v = NewVerboseStore(4 * size)
	v.watch(j)
	running(v, "c1")
	for range verbosePruneEvery - 1 {
		running(v, "c2")
	}
	running(v, "c3")
	running(v, "c4")
	// c1..c4 fill the bound; c5 makes it 5: c1, whose item the journal
	// does not have, goes.
	running(v, "c5")
	if kept(v, "c1") {
		t.Error("past the bound, the answer of an item the journal does not have is kept")
	}
	for _, id := range []string{"c2", "c3", "c4", "c5"} {
		if !kept(v, id) {
			t.Errorf("past the bound, live %s's answer went before a removed one's", id)
		}
	}
	// Every item live: the oldest goes.
	running(v, "c0")
	if kept(v, "c2") || !kept(v, "c0") {
		t.Error("past the bound with every item live, the oldest answer is kept (or the newest is not)")
	}
	if n, b := v.size(); n != 4 || b > 4*size {
		t.Errorf("%d answers of %d bytes kept, want 4 within the bound %d", n, b, 4*size)
	}
	// An answer larger than the bound is not kept (nor does it evict).
	v.ContainerVerbose("c3", cruntime.StateRunning, resp("c3", runtimeapi.ContainerState_CONTAINER_RUNNING, int(5*size)))
	if kept(v, "c3") {
		t.Error("an answer larger than the bound is kept")
	}
	if n, _ := v.size(); n != 3 {
		t.Errorf("%d answers kept after an oversized one replaced c3's, want 3", n)
	}
}

// Evicting costs one visit an answer evicted, not a scan of the store:
// filling a full store of n answers with n new ones is linear in n.
func TestVerboseEvictionLinear(t *testing.T) {
	const n = 2000
	r := func(id string) *runtimeapi.ContainerStatusResponse {
		return &runtimeapi.ContainerStatusResponse{
			Status: &runtimeapi.ContainerStatus{Id: id, State: runtimeapi.ContainerState_CONTAINER_RUNNING},
			Info:   map[string]string{"info": strings.Repeat("x", 100)},
		}
	}
	size := int64(proto.Size(r("c0000")))
	v := NewVerboseStore(n * size)
	for i := range n {
		v.ContainerVerbose(fmt.Sprintf("c%04d", i), cruntime.StateRunning, r(fmt.Sprintf("c%04d", i)))
	}
	if got, _ := v.size(); got != n || v.visited != 0 {
		t.Fatalf("%d answers kept and %d visited filling the bound, want %d and 0", got, v.visited, n)
	}
	for i := range n {
		v.ContainerVerbose(fmt.Sprintf("d%04d", i), cruntime.StateRunning, r(fmt.Sprintf("d%04d", i)))
	}
	if got, _ := v.size(); got != n {
		t.Fatalf("%d answers kept, want %d", got, n)
	}
	if v.visited != n {
		t.Errorf("%d answers visited to evict %d, want %d: eviction is not O(1)", v.visited, n, n)
	}
	// The oldest went, in order.
	if _, ok := v.get("ContainerStatus", "c1999", cruntime.StateRunning); ok {
		t.Error("an old answer outlived the eviction")
	}
	if _, ok := v.get("ContainerStatus", "d0000", cruntime.StateRunning); !ok {
		t.Error("the oldest new answer was evicted")
	}
}
