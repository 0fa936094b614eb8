package cri

import (
	"bytes"
	"context"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
)

// node is an evolving set of list items served by a fakeCRI: a runtime
// whose replies come in random order, with map entries in random order.
type node struct {
	mu         sync.Mutex
	sandboxes  []*runtimeapi.PodSandbox
	containers []*runtimeapi.Container
	rng        *rand.Rand
	next       int
}

func (n *node) serve(f *fakeCRI) {
	f.listSandboxes = func(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
		n.mu.Lock()
		defer n.mu.Unlock()
		items := slices.Clone(n.sandboxes)
		n.rng.Shuffle(len(items), func(i, j int) { items[i], items[j] = items[j], items[i] })
		return &runtimeapi.ListPodSandboxResponse{Items: items}, nil
	}
	f.listContainers = func(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
		n.mu.Lock()
		defer n.mu.Unlock()
		items := slices.Clone(n.containers)
		n.rng.Shuffle(len(items), func(i, j int) { items[i], items[j] = items[j], items[i] })
		return &runtimeapi.ListContainersResponse{Containers: items}, nil
	}
}

func (n *node) id(p string) string { n.next++; return fmt.Sprintf("%s-%d", p, n.next) }

// kubeletLabels are the labels and annotations a kubelet puts on a
// container: several entries, so their encoding order varies.
func (n *node) addContainer(uid, pod string) {
	name := n.id("ctr")
	labels := label(uid, pod, "default", name)
	labels["app"] = pod
	n.containers = append(n.containers, &runtimeapi.Container{
		Id: n.id("c"), PodSandboxId: "sb-" + uid,
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: "img:" + name}, ImageRef: "sha256:" + name,
		State: runtimeapi.ContainerState_CONTAINER_RUNNING, CreatedAt: int64(n.next), Labels: labels,
		Annotations: map[string]string{"io.kubernetes.container.hash": name, "io.kubernetes.container.restartCount": "0",
			"io.kubernetes.container.terminationMessagePath": "/dev/termination-log"},
	})
}

func (n *node) addPod(containers int) {
	uid, pod := n.id("uid"), n.id("pod")
	sb := sandbox(n.id("sb"), uid, pod, "default", 0, runtimeapi.PodSandboxState_SANDBOX_READY, int64(n.next))
	sb.Annotations = map[string]string{"a": "1", "b": "2", "c": "3"}
	n.sandboxes = append(n.sandboxes, sb)
	for range containers {
		n.addContainer(uid, pod)
	}
}

// change makes one random change and returns the UID of the pod it
// changed ("" when the change was no change).
func (n *node) change() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch k := n.rng.IntN(7); {
	case k == 0 || len(n.containers) == 0:
		n.addPod(1 + n.rng.IntN(3))
		return n.sandboxes[len(n.sandboxes)-1].Metadata.Uid
	case k == 1:
		i := n.rng.IntN(len(n.sandboxes))
		sb := copySandbox(n.sandboxes[i])
		if sb.State == runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
			return "" // no change
		}
		sb.State = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
		n.sandboxes[i] = sb
		return sb.Metadata.Uid
	case k == 2:
		i := n.rng.IntN(len(n.containers))
		c := n.containers[i]
		n.containers = slices.Delete(n.containers, i, i+1)
		return c.Labels[cruntime.LabelPodUID]
	case k == 3:
		c := n.containers[n.rng.IntN(len(n.containers))]
		uid := c.Labels[cruntime.LabelPodUID]
		n.addContainer(uid, c.Labels[cruntime.LabelPodName])
		return uid
	case k == 4:
		// A pod goes: its sandbox and containers.
		i := n.rng.IntN(len(n.sandboxes))
		uid := n.sandboxes[i].Metadata.Uid
		n.sandboxes = slices.Delete(n.sandboxes, i, i+1)
		n.containers = slices.DeleteFunc(n.containers, func(c *runtimeapi.Container) bool { return c.Labels[cruntime.LabelPodUID] == uid })
		return uid
	default:
		i := n.rng.IntN(len(n.containers))
		c := copyContainer(n.containers[i])
		if c.State == runtimeapi.ContainerState_CONTAINER_EXITED {
			return ""
		}
		c.State = runtimeapi.ContainerState_CONTAINER_EXITED
		n.containers[i] = c
		return c.Labels[cruntime.LabelPodUID]
	}
}

// copySandbox and copyContainer copy an item, so a reply already sent is not changed.
func copySandbox(s *runtimeapi.PodSandbox) *runtimeapi.PodSandbox {
	return &runtimeapi.PodSandbox{Id: s.Id, Metadata: s.Metadata, State: s.State, CreatedAt: s.CreatedAt,
		Labels: s.Labels, Annotations: s.Annotations, RuntimeHandler: s.RuntimeHandler}
}

func copyContainer(s *runtimeapi.Container) *runtimeapi.Container {
	c := &runtimeapi.Container{Id: s.Id, PodSandboxId: s.PodSandboxId, Metadata: s.Metadata, Image: s.Image,
		ImageRef: s.ImageRef, State: s.State, CreatedAt: s.CreatedAt, Labels: s.Labels, Annotations: map[string]string{}}
	for k, v := range s.Annotations {
		c.Annotations[k] = v
	}
	return c
}

// sortedItems is a listing with each pod's items in ID order: a runtime's
// order is not stable between calls, and a pod kept from the previous
// listing has that listing's order.
func sortedItems(pods []*cruntime.Pod) []*cruntime.Pod {
	out := make([]*cruntime.Pod, len(pods))
	for i, p := range pods {
		c := *p
		byID := func(a, b *cruntime.Container) int { return strings.Compare(a.ID, b.ID) }
		c.Sandboxes = slices.SortedFunc(slices.Values(p.Sandboxes), byID)
		c.Containers = slices.SortedFunc(slices.Values(p.Containers), byID)
		out[i] = &c
	}
	return out
}

// TestListPodsMemo: over random changes to a node whose replies come in
// random order, a listing with the memo is the listing decoded afresh; an
// unchanged pod is the previous listing's pod, and a changed one is not.
func TestListPodsMemo(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			n := &node{rng: rand.New(rand.NewPCG(seed, 1))}
			for range 20 {
				n.addPod(1 + n.rng.IntN(4))
			}
			f := &fakeCRI{}
			n.serve(f)
			c := f.start(t)
			ctx := context.Background()
			prev, err := c.ListPods(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var reusedPods int
			for round := range 40 {
				changed := map[string]bool{}
				for range n.rng.IntN(4) {
					changed[n.change()] = true
				}
				got, err := c.ListPods(ctx)
				if err != nil {
					t.Fatal(err)
				}
				// Without the memo: a concurrent listing goes without it.
				c.memo.mu.Lock()
				fresh, err := c.ListPods(ctx)
				c.memo.mu.Unlock()
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(sortedItems(got), sortedItems(fresh)) {
					t.Fatalf("round %d: with the memo\n%s\nafresh\n%s", round, dump(got), dump(fresh))
				}
				// The memo holds what the node has, no more.
				n.mu.Lock()
				if c.memo.containers.items.len() != len(n.containers) || c.memo.sandboxes.items.len() != len(n.sandboxes) {
					t.Fatalf("round %d: memo holds %d containers and %d sandboxes, the node %d and %d", round,
						c.memo.containers.items.len(), c.memo.sandboxes.items.len(), len(n.containers), len(n.sandboxes))
				}
				n.mu.Unlock()
				before := map[string]*cruntime.Pod{}
				for _, p := range prev {
					before[string(p.UID)] = p
				}
				for _, p := range got {
					same := before[string(p.UID)] == p
					if changed[string(p.UID)] && same {
						t.Errorf("round %d: changed pod %s is the previous listing's", round, p.UID)
					}
					if !changed[string(p.UID)] && before[string(p.UID)] != nil && !same {
						t.Errorf("round %d: unchanged pod %s was built again", round, p.UID)
					}
					if same {
						reusedPods++
					}
				}
				prev = got
			}
			if reusedPods == 0 {
				t.Fatal("no pod was ever reused")
			}
		})
	}
}

// TestListPodsMemoSurvivesFailure: a listing that fails half way leaves the
// memo as it was.
func TestListPodsMemoSurvivesFailure(t *testing.T) {
	n := &node{rng: rand.New(rand.NewPCG(9, 9))}
	for range 5 {
		n.addPod(2)
	}
	f := &fakeCRI{}
	n.serve(f)
	serveContainers := f.listContainers
	var fail sync.Mutex
	failing := false
	f.listContainers = func(ctx context.Context, r *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
		fail.Lock()
		defer fail.Unlock()
		if failing {
			return nil, fmt.Errorf("runtime restarting")
		}
		return serveContainers(ctx, r)
	}
	c := f.start(t)
	ctx := context.Background()
	first, err := c.ListPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fail.Lock()
	failing = true
	fail.Unlock()
	n.change()
	if _, err := c.ListPods(ctx); err == nil {
		t.Fatal("no error")
	}
	fail.Lock()
	failing = false
	fail.Unlock()
	got, err := c.ListPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.memo.mu.Lock()
	fresh, _ := c.ListPods(ctx)
	c.memo.mu.Unlock()
	if !reflect.DeepEqual(sortedItems(got), sortedItems(fresh)) {
		t.Fatalf("after a failed listing\n%s\nafresh\n%s", dump(got), dump(fresh))
	}
	if len(first) == 0 {
		t.Fatal("empty node")
	}
}

// TestListPodsIdleCost: listing an unchanged node decodes no item; after a
// change, only the changed items are decoded.
func TestListPodsIdleCost(t *testing.T) {
	n := &node{rng: rand.New(rand.NewPCG(1, 1))}
	for range 50 {
		n.addPod(5)
	}
	f := &fakeCRI{}
	n.serve(f)
	c := f.start(t)
	ctx := context.Background()
	decoded := func() int {
		t.Helper()
		if _, err := c.ListPods(ctx); err != nil {
			t.Fatal(err)
		}
		return c.memo.sandboxes.decoded + c.memo.containers.decoded
	}
	if got := decoded(); got != 300 {
		t.Fatalf("first listing decoded %d items, want all 300", got)
	}
	for range 3 {
		if got := decoded(); got != 0 {
			t.Fatalf("idle listing decoded %d items, want 0", got)
		}
	}
	n.mu.Lock()
	n.containers[7] = copyContainer(n.containers[7])
	n.containers[7].State = runtimeapi.ContainerState_CONTAINER_EXITED
	n.mu.Unlock()
	if got := decoded(); got != 1 {
		t.Fatalf("listing after one container exited decoded %d items, want 1", got)
	}
}

// TestItemKey: the key changes with the state wherever an encoder puts it,
// and not with the order of map entries.
func TestItemKey(t *testing.T) {
	seed := maphash.MakeSeed()
	enc := func(stateLast bool, state uint64, labels ...string) []byte {
		var b []byte
		b = protowire.AppendTag(b, fieldContainerID, protowire.BytesType)
		b = protowire.AppendString(b, "c1")
		if !stateLast {
			b = protowire.AppendTag(b, fieldContainerState, protowire.VarintType)
			b = protowire.AppendVarint(b, state)
		}
		for _, l := range labels {
			var e []byte
			e = protowire.AppendTag(e, fieldMapKey, protowire.BytesType)
			e = protowire.AppendString(e, l)
			e = protowire.AppendTag(e, fieldMapValue, protowire.BytesType)
			e = protowire.AppendString(e, "v")
			b = protowire.AppendTag(b, fieldContainerLabels, protowire.BytesType)
			b = protowire.AppendBytes(b, e)
		}
		if stateLast {
			b = protowire.AppendTag(b, fieldContainerState, protowire.VarintType)
			b = protowire.AppendVarint(b, state)
		}
		return b
	}
	for _, last := range []bool{false, true} {
		k1 := itemKey(seed, enc(last, 1, "a", "b"), containerMaps)
		k2 := itemKey(seed, enc(last, 1, "b", "a"), containerMaps)
		k3 := itemKey(seed, enc(last, 2, "a", "b"), containerMaps)
		// The key covers the ID: the memo confirms a match by length only.
		other := bytes.Replace(enc(last, 1, "a", "b"), []byte("c1"), []byte("c9"), 1)
		if k4 := itemKey(seed, other, containerMaps); k4 == k1 {
			t.Errorf("state last=%v: another ID kept the key", last)
		}
		if k1 != k2 {
			t.Errorf("state last=%v: the order of map entries changed the key", last)
		}
		if k1 == k3 {
			t.Errorf("state last=%v: a new state kept the key", last)
		}
	}
}

// listOnce makes one listing of the two replies with the memo m, as
// ListPods does, each reply in pieces of at most maxPiece bytes.
func listOnce(c *Client, m *memo, sandboxes, containers []byte, rng *rand.Rand, maxPiece int) ([]*cruntime.Pod, error) {
	l := startListing(m)
	if err := decodeListSlice(pieces(rng, sandboxes, maxPiece), &l.sandboxes); err != nil {
		return nil, err
	}
	if err := decodeListSlice(pieces(rng, containers, maxPiece), &l.containers); err != nil {
		return nil, err
	}
	return c.endListing(l), nil
}

// TestListPodsMemoRepeatedItem: a listing that has the last listing's items
// and as many, but one of them twice and another not at all, is not the
// last listing.
func TestListPodsMemoRepeatedItem(t *testing.T) {
	sb := marshal(t, &runtimeapi.ListPodSandboxResponse{Items: []*runtimeapi.PodSandbox{
		sandbox("sb", "uid", "pod", "ns", 0, runtimeapi.PodSandboxState_SANDBOX_READY, 1)}})
	x := container("c-x", "x", 0, runtimeapi.ContainerState_CONTAINER_RUNNING, "img", 2, label("uid", "pod", "ns", "x"))
	y := container("c-y", "y", 0, runtimeapi.ContainerState_CONTAINER_EXITED, "img", 3, label("uid", "pod", "ns", "y"))
	rng := rand.New(rand.NewPCG(1, 1))
	c, m := &Client{}, &memo{}
	for i, cts := range [][]*runtimeapi.Container{{x, x, y}, {x, y, y}, {x, y, y}, {x, x, y}} {
		pods, err := listOnce(c, m, sb, marshal(t, &runtimeapi.ListContainersResponse{Containers: cts}), rng, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, ct := range pods[0].Containers {
			got = append(got, ct.ID)
		}
		var want []string
		for _, ct := range cts {
			want = append(want, ct.Id)
		}
		if !slices.Equal(got, want) {
			t.Errorf("listing %d: containers %v, want %v", i, got, want)
		}
	}
}

// TestListPodsMemoAfterFailedListing: an item decoded by a listing that
// failed later is in the memo, but in no pod built so far: the pod it
// belongs to is built again.
func TestListPodsMemoAfterFailedListing(t *testing.T) {
	reply := func(items ...*runtimeapi.PodSandbox) []byte {
		return marshal(t, &runtimeapi.ListPodSandboxResponse{Items: items})
	}
	s1 := sandbox("sb-1", "uid", "pod", "ns", 0, runtimeapi.PodSandboxState_SANDBOX_NOTREADY, 1)
	s2 := sandbox("sb-2", "uid", "pod", "ns", 1, runtimeapi.PodSandboxState_SANDBOX_READY, 2)
	rng := rand.New(rand.NewPCG(1, 1))
	c, m := &Client{}, &memo{}
	if _, err := listOnce(c, m, reply(s1), nil, rng, 1<<20); err != nil {
		t.Fatal(err)
	}
	// The sandbox was replaced; the container reply is cut short.
	if _, err := listOnce(c, m, reply(s2), []byte{0x0a, 0x05}, rng, 1<<20); err == nil {
		t.Fatal("a truncated reply was decoded")
	}
	pods, err := listOnce(c, m, reply(s2), nil, rng, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 1 || len(pods[0].Sandboxes) != 1 || pods[0].Sandboxes[0].ID != "sb-2" {
		t.Fatalf("after a failed listing: %s, want the pod with sb-2", dump(pods))
	}
}
