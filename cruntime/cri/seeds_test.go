package cri

import (
	"bytes"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
)

var writeSeeds = flag.Bool("write-seeds", false, "write the generated fuzz seeds into testdata/fuzz")

// corpusFile is a fuzz corpus entry in the format of `go test`
// (internal/fuzz: "go test fuzz v1", then one Go literal per argument).
func corpusFile(args ...any) []byte {
	b := []byte("go test fuzz v1\n")
	for _, a := range args {
		switch a := a.(type) {
		case []byte:
			b = fmt.Appendf(b, "[]byte(%q)\n", a)
		case string:
			b = fmt.Appendf(b, "string(%q)\n", a)
		case bool, uint64:
			b = fmt.Appendf(b, "%T(%v)\n", a, a)
		default:
			panic(fmt.Sprintf("corpusFile: %T", a))
		}
	}
	return b
}

// det marshals m deterministically (map entries sorted), so that a seed is
// the same every time it is generated.
func det(m proto.Message) []byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// containerReversed encodes c with its labels in reverse order, after its
// annotations: an encoder that does not write fields in number order.
func containerReversed(c *runtimeapi.Container) []byte {
	c = proto.CloneOf(c)
	labels := c.Labels
	c.Labels = nil
	b := det(c)
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range labels {
			if !yield(k) {
				return
			}
		}
	})
	slices.Reverse(keys)
	for _, k := range keys {
		b = msg(b, fieldContainerLabels, labelEntry(k, labels[k]))
	}
	return b
}

// replyOf encodes a list reply of the items' encodings.
func replyOf(items ...[]byte) []byte {
	var b []byte
	for _, it := range items {
		b = msg(b, fieldListItems, it)
	}
	return b
}

// fuzzSeeds returns the generated seeds of each fuzz target, by file name.
func fuzzSeeds() map[string]map[string][]byte {
	seeds := map[string]map[string][]byte{}
	add := func(target, name string, args ...any) {
		if seeds[target] == nil {
			seeds[target] = map[string][]byte{}
		}
		seeds[target]["seed-"+name] = corpusFile(args...)
	}

	// FuzzWireDecode: replies with every shape grouping cares about,
	// hostile ones, and the wire format's edges.
	sb, ct := randomReplies(rand.New(rand.NewPCG(3, 4)), 4)
	add("FuzzWireDecode", "random-sandboxes", det(sb), true, uint64(7))
	add("FuzzWireDecode", "random-containers", det(ct), false, uint64(20))
	n := &node{rng: rand.New(rand.NewPCG(1, 1))}
	for range 2 {
		n.addPod(2)
	}
	add("FuzzWireDecode", "node-sandboxes", det(&runtimeapi.ListPodSandboxResponse{Items: n.sandboxes}), true, uint64(60))
	add("FuzzWireDecode", "node-containers", det(&runtimeapi.ListContainersResponse{Containers: n.containers}), false, uint64(3))
	add("FuzzWireDecode", "labels-reversed", replyOf(containerReversed(n.containers[0]), containerReversed(n.containers[1])), false, uint64(9))
	for _, h := range hostileReplies {
		add("FuzzWireDecode", "hostile-"+h.name, h.build(400), h.sandboxes, uint64(len(h.name)))
	}
	item := str(nil, fieldContainerID, "c")
	item = msg(item, fieldContainerMetadata, str(nil, fieldContainerMetaName, "n"))
	item = msg(item, fieldContainerLabels, labelEntry(cruntime.LabelPodUID, "u"))
	group := tag(varint(tag(nil, 7, protowire.StartGroupType), 3, 1), 7, protowire.EndGroupType)
	add("FuzzWireDecode", "top-level-group", append(slices.Clone(group), replyOf(item)...), false, uint64(1))
	add("FuzzWireDecode", "group-in-item", replyOf(append(slices.Clone(item), group...)), false, uint64(2))
	add("FuzzWireDecode", "largest-field-number", append(varint(nil, protowire.MaxValidNumber, 1), replyOf(item)...), false, uint64(0))
	add("FuzzWireDecode", "not-utf8", replyOf(str(msg(str(nil, fieldSandboxID, "\xff\xfe"), fieldSandboxMetadata,
		str(nil, fieldSandboxMetaUID, "u\x80")), 99, "x")), true, uint64(0))
	add("FuzzWireDecode", "uid-label-twice", replyOf(msg(msg(slices.Clone(item), fieldContainerLabels,
		labelEntry(cruntime.LabelPodUID, "")), fieldContainerLabels, labelEntry(cruntime.LabelPodUID, "w"))), false, uint64(5))
	add("FuzzWireDecode", "metadata-twice", replyOf(msg(msg(str(nil, fieldSandboxID, "s"), fieldSandboxMetadata,
		str(nil, fieldSandboxMetaUID, "u")), fieldSandboxMetadata, varint(nil, fieldSandboxMetaAttempt, 3))), true, uint64(4))

	// FuzzListingMemo: a node changing between listings, replies in
	// random order, one listing failing half way, items repeated. Small
	// items, so that the fuzzer's inputs stay small.
	n = &node{rng: rand.New(rand.NewPCG(2, 2))}
	for i := range 2 {
		uid, pod := fmt.Sprint("u", i), fmt.Sprint("p", i)
		n.sandboxes = append(n.sandboxes, sandbox(fmt.Sprint("s", i), uid, pod, "ns", 0, runtimeapi.PodSandboxState_SANDBOX_READY, 1))
		for j := range 2 {
			c := container(fmt.Sprint("c", i, j), fmt.Sprint("n", j), 0, runtimeapi.ContainerState_CONTAINER_RUNNING, "i", 2,
				label(uid, pod, "ns", fmt.Sprint("n", j)))
			c.Annotations = map[string]string{"a": "1"}
			n.containers = append(n.containers, c)
		}
	}
	listing := func(maxPiece int) [2]fuzzReply {
		return [2]fuzzReply{
			{maxPiece, det(&runtimeapi.ListPodSandboxResponse{Items: n.sandboxes})},
			{maxPiece, det(&runtimeapi.ListContainersResponse{Containers: n.containers})},
		}
	}
	change := func(i int) {
		switch i % 3 {
		case 0: // a container exits
			c := proto.CloneOf(n.containers[i%len(n.containers)])
			c.State = runtimeapi.ContainerState_CONTAINER_EXITED
			n.containers[i%len(n.containers)] = c
		case 1: // a container is added to a pod
			c := proto.CloneOf(n.containers[0])
			c.Id = fmt.Sprint("c", i)
			n.containers = append(n.containers, c)
		case 2: // a sandbox is replaced
			sb := proto.CloneOf(n.sandboxes[0])
			sb.Id, sb.Metadata.Attempt = fmt.Sprint("s", i), uint32(i)
			n.sandboxes[0] = sb
		}
	}
	var seq [][2]fuzzReply
	for i := range 4 {
		seq = append(seq, listing(1+i*37))
		change(i)
	}
	add("FuzzListingMemo", "node-changing", writeListings(seq...))
	before := listing(256)
	change(5) // the sandbox is replaced during a listing that fails
	failed := listing(256)
	failed[1].b = failed[1].b[:len(failed[1].b)/2]
	add("FuzzListingMemo", "failed-listing", writeListings(before, failed, listing(5)))
	shuffled := listing(13)
	slices.Reverse(n.containers)
	add("FuzzListingMemo", "reordered", writeListings(shuffled, listing(13)))
	var cts [][]byte // of pod u0
	for _, c := range n.containers {
		if c.Labels[cruntime.LabelPodUID] == "u0" {
			cts = append(cts, det(c))
		}
	}
	sbs := listing(256)[0]
	once := [2]fuzzReply{sbs, {256, replyOf(cts...)}}
	xxy := [2]fuzzReply{sbs, {256, replyOf(cts[0], cts[0], cts[1])}}
	xyy := [2]fuzzReply{sbs, {256, replyOf(cts[0], cts[1], cts[1])}}
	reversed := [2]fuzzReply{sbs, {256, replyOf(containerReversed(n.containers[0]), containerReversed(n.containers[1]))}}
	add("FuzzListingMemo", "repeated-items", writeListings(once, xxy, xyy, xyy, once))
	add("FuzzListingMemo", "labels-reordered", writeListings(once, reversed, once))

	// The status and event conversions.
	for i, s := range []*runtimeapi.ContainerStatus{
		{Id: "c1", Metadata: &runtimeapi.ContainerMetadata{Name: "app", Attempt: 2}, State: runtimeapi.ContainerState_CONTAINER_EXITED,
			CreatedAt: 1, StartedAt: 2, FinishedAt: 3, ExitCode: 137, Image: &runtimeapi.ImageSpec{Image: "img"},
			ImageRef: "sha256:1", Reason: "OOMKilled", Message: "out of memory", Labels: label("uid", "pod", "ns", "app")},
		{Labels: map[string]string{cruntime.LabelContainerName: "from-label"}, State: runtimeapi.ContainerState(9)},
		{},
	} {
		add("FuzzContainerStatus", fmt.Sprint("status-", i), det(s), "c1", "listed-name", "img")
	}
	add("FuzzPodSandboxStatus", "ready", det(sandboxStatus("sb", runtimeapi.PodSandboxState_SANDBOX_READY, 5, "10.0.0.1", "", "fd00::1")), "sb")
	hostNet := sandboxStatus("", runtimeapi.PodSandboxState_SANDBOX_NOTREADY, 6, "")
	hostNet.Linux = &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{
		Options: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}}
	add("FuzzPodSandboxStatus", "host-network", det(hostNet), "listed-sb")
	for i, e := range []*runtimeapi.ContainerEventResponse{
		{ContainerId: "c1", ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, CreatedAt: 7,
			PodSandboxStatus: sandboxStatus("sb", runtimeapi.PodSandboxState_SANDBOX_READY, 5, "10.0.0.1")},
		{ContainerId: "c2", ContainerEventType: runtimeapi.ContainerEventType(8),
			ContainersStatuses: []*runtimeapi.ContainerStatus{{Id: "c2", Labels: label("uid-2", "pod-2", "ns-2", "app")}}},
		{ContainerId: "c3", PodSandboxStatus: &runtimeapi.PodSandboxStatus{Metadata: &runtimeapi.PodSandboxMetadata{Name: "no-uid"}},
			ContainersStatuses: []*runtimeapi.ContainerStatus{{Labels: label("uid-3", "", "", "")}}},
	} {
		add("FuzzContainerEvent", fmt.Sprint("event-", i), det(e))
	}
	return seeds
}

// TestFuzzSeeds: the committed corpus has the generated seeds (write them
// with `go test -run TestFuzzSeeds -write-seeds ./cruntime/cri`), and every
// entry of the corpus is of a fuzz target of the package.
func TestFuzzSeeds(t *testing.T) {
	seeds := fuzzSeeds()
	for target, files := range seeds {
		dir := filepath.Join("testdata", "fuzz", target)
		for name, want := range files {
			path := filepath.Join(dir, name)
			if *writeSeeds {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, want, 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Errorf("seed %s: %v (write the seeds with -write-seeds)", path, err)
				continue
			}
			if !bytes.Equal(got, want) {
				t.Errorf("seed %s differs from the one generated (write the seeds with -write-seeds)", path)
			}
		}
	}
	dirs, err := os.ReadDir(filepath.Join("testdata", "fuzz"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if seeds[d.Name()] == nil {
			t.Errorf("testdata/fuzz/%s: no such fuzz target with generated seeds", d.Name())
		}
	}
}
