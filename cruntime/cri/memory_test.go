package cri

import (
	"fmt"
	"math/rand/v2"
	goruntime "runtime"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
)

// Hostile list replies: valid protobuf that a runtime (or whatever listens
// on its socket) could send, shaped to make a decoder keep as much as it
// can per byte of reply.

// tag appends a field's tag.
func tag(b []byte, num protowire.Number, typ protowire.Type) []byte {
	return protowire.AppendTag(b, num, typ)
}

// str appends a length-delimited field.
func str(b []byte, num protowire.Number, s string) []byte {
	return protowire.AppendString(tag(b, num, protowire.BytesType), s)
}

// msg appends a length-delimited field holding the message m.
func msg(b []byte, num protowire.Number, m []byte) []byte {
	return protowire.AppendBytes(tag(b, num, protowire.BytesType), m)
}

// varint appends a varint field.
func varint(b []byte, num protowire.Number, x uint64) []byte {
	return protowire.AppendVarint(tag(b, num, protowire.VarintType), x)
}

// name is the i-th of distinct short printable strings.
func name(i int) string {
	const digits = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	var b []byte
	for {
		b = append(b, digits[i%len(digits)])
		i /= len(digits)
		if i == 0 {
			return string(b)
		}
	}
}

// labelEntry is one map entry of labels.
func labelEntry(k, v string) []byte {
	return str(str(nil, fieldMapKey, k), fieldMapValue, v)
}

// hostileReply is a reply of about size bytes.
type hostileReply struct {
	name      string
	sandboxes bool
	small     bool // its valid items have only strings under internMin
	// item returns the i-th item's bytes in a reply of size bytes; nil
	// ends the reply early.
	item func(i, size int) []byte
}

var hostileReplies = []hostileReply{
	// For comparison: what a kubelet's node lists, pods of 10 containers
	// with 64-digit IDs, UUIDs, the kubelet's labels and annotations.
	{"kubelet-sandboxes", true, false, func(i, size int) []byte {
		uid := fmt.Sprintf("3f1c6a2e-0c41-4d8e-9a51-%012d", i)
		sb := sandbox(fmt.Sprintf("%064x", i), uid, fmt.Sprintf("web-7d9c6b8f5-%05d", i), "default", 0,
			runtimeapi.PodSandboxState_SANDBOX_READY, 1700000000000000000+int64(i))
		sb.Annotations = map[string]string{"kubernetes.io/config.seen": "2026-11-25T10:00:00Z", "kubernetes.io/config.source": "api"}
		sb.RuntimeHandler = "runc"
		return det(sb)
	}},
	{"kubelet-containers", false, false, func(i, size int) []byte {
		uid := fmt.Sprintf("3f1c6a2e-0c41-4d8e-9a51-%012d", i/10)
		name := fmt.Sprintf("container-%d", i%10)
		c := container(fmt.Sprintf("%064x", 1<<40+i), name, 0, runtimeapi.ContainerState_CONTAINER_RUNNING,
			"registry.k8s.io/e2e-test-images/agnhost:2.53", 1700000000000000000+int64(i),
			label(uid, fmt.Sprintf("web-7d9c6b8f5-%05d", i/10), "default", name))
		c.PodSandboxId, c.ImageRef = fmt.Sprintf("%064x", i/10), "sha256:"+fmt.Sprintf("%064x", 7)
		c.Annotations = map[string]string{"io.kubernetes.container.hash": "5e3f1c2a", "io.kubernetes.container.restartCount": "0",
			"io.kubernetes.container.terminationMessagePath": "/dev/termination-log", "io.kubernetes.pod.terminationGracePeriod": "30"}
		return det(c)
	}},
	// 2.8 M items of 4–6 bytes at 16 MiB: no ID, no metadata, each a
	// distinct creation time (the reproduction).
	{"tiny-no-id", false, false, func(i, size int) []byte { return varint(nil, fieldContainerCreatedAt, uint64(i+1)) }},
	{"tiny-no-id-sandboxes", true, false, func(i, size int) []byte { return varint(nil, fieldSandboxCreatedAt, uint64(i+1)) }},
	// A distinct ID, no metadata.
	{"no-metadata", false, false, func(i, size int) []byte { return str(nil, fieldContainerID, name(i)) }},
	// Metadata with a pod UID, no ID.
	{"empty-id", true, false, func(i, size int) []byte {
		return msg(nil, fieldSandboxMetadata, str(nil, fieldSandboxMetaUID, name(i)))
	}},
	// The smallest valid sandboxes: a distinct ID and pod UID each, so
	// every item is a pod of its own.
	{"tiny-valid-sandboxes", true, true, func(i, size int) []byte {
		return msg(str(nil, fieldSandboxID, name(i)), fieldSandboxMetadata, str(nil, fieldSandboxMetaUID, name(i)))
	}},
	// The smallest valid containers: a distinct ID, empty metadata, the
	// pod UID label.
	{"tiny-valid-containers", false, true, func(i, size int) []byte {
		b := str(nil, fieldContainerID, name(i))
		b = msg(b, fieldContainerMetadata, nil)
		return msg(b, fieldContainerLabels, labelEntry(cruntime.LabelPodUID, name(i)))
	}},
	// One ID for all, each a distinct creation time: valid items that the
	// memo cannot tell apart by ID.
	{"duplicate-ids", true, true, func(i, size int) []byte {
		b := str(nil, fieldSandboxID, "a")
		b = msg(b, fieldSandboxMetadata, str(nil, fieldSandboxMetaUID, "u"))
		return varint(b, fieldSandboxCreatedAt, uint64(i+1))
	}},
	// The same item over and over.
	{"same-item", false, true, func(i, size int) []byte {
		b := str(nil, fieldContainerID, "c")
		b = msg(b, fieldContainerMetadata, str(nil, fieldContainerMetaName, "n"))
		return msg(b, fieldContainerLabels, labelEntry(cruntime.LabelPodUID, "u"))
	}},
	// One container whose label map fills the reply: distinct keys, and
	// the pod UID label repeated with distinct values (the last counts).
	{"huge-labels", false, false, func(i, size int) []byte {
		if i > 0 {
			return nil
		}
		b := str(nil, fieldContainerID, "c")
		b = msg(b, fieldContainerMetadata, nil)
		for j := 0; len(b) < size-64; j++ {
			b = msg(b, fieldContainerLabels, labelEntry("k"+name(j), "v"))
			b = msg(b, fieldContainerLabels, labelEntry(cruntime.LabelPodUID, name(j)))
		}
		return b
	}},
	// Items whose metadata holds an unknown message nested 100 deep and
	// unknown groups nested 100 deep.
	{"deep-nesting", true, true, func(i, size int) []byte {
		var nested []byte
		for range 100 {
			nested = msg(nil, 15, nested)
		}
		b := str(nil, fieldSandboxMetaUID, name(i))
		b = append(b, nested...)
		b = tag(b, 16, protowire.StartGroupType)
		for range 100 {
			b = tag(b, 17, protowire.StartGroupType)
		}
		for range 100 {
			b = tag(b, 17, protowire.EndGroupType)
		}
		b = tag(b, 16, protowire.EndGroupType)
		return msg(str(nil, fieldSandboxID, name(i)), fieldSandboxMetadata, b)
	}},
}

// hostileSize is the size of the hostile replies of the benchmarks: the
// largest message the client accepts (maxMsgSize).
const hostileSize = maxMsgSize

// build returns the reply, at most size bytes.
func (h hostileReply) build(size int) []byte {
	var out []byte
	for i := 0; ; i++ {
		it := h.item(i, size)
		if it == nil {
			return out
		}
		next := msg(nil, fieldListItems, it)
		if len(out)+len(next) > size {
			return out
		}
		out = append(out, next...)
	}
}

// liveHeap returns the bytes of heap that f's result keeps reachable.
func liveHeap(f func() any) uint64 {
	var ms goruntime.MemStats
	goruntime.GC()
	goruntime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	keep := f()
	goruntime.GC()
	goruntime.ReadMemStats(&ms)
	after := ms.HeapAlloc
	goruntime.KeepAlive(keep)
	if after < before {
		return 0
	}
	return after - before
}

// decodeKept decodes raw as a reply of a listing with a memo, as ListPods
// does, in gRPC's 16 KiB pieces, and returns what the decode keeps: the
// memo (its items, table and strings) and the listing's items.
func decodeKept(t testing.TB, raw []byte, sandboxes bool) any {
	m := &memo{}
	l := startListing(m)
	r := &l.containers
	if sandboxes {
		r = &l.sandboxes
	}
	if err := decodeListSlice(pieces(rand.New(rand.NewPCG(1, 2)), raw, 16<<10), r); err != nil {
		t.Fatal(err)
	}
	l.strs.end(l.strings)
	r.memo.commit()
	return []any{m, r.items}
}

// listingKept makes a whole listing of raw (the other reply empty) with a
// memo, and returns what it keeps: the memo and the pods.
func listingKept(t testing.TB, raw []byte, sandboxes bool) any {
	m := &memo{}
	l := startListing(m)
	r := &l.containers
	if sandboxes {
		r = &l.sandboxes
	}
	if err := decodeListSlice(pieces(rand.New(rand.NewPCG(1, 2)), raw, 16<<10), r); err != nil {
		t.Fatal(err)
	}
	c := &Client{}
	return []any{m, c.endListing(l)}
}

// standardKept decodes raw with the generated types.
func standardKept(t testing.TB, raw []byte, sandboxes bool) any {
	var m proto.Message = &runtimeapi.ListContainersResponse{}
	if sandboxes {
		m = &runtimeapi.ListPodSandboxResponse{}
	}
	if err := proto.Unmarshal(raw, m); err != nil {
		t.Fatal(err)
	}
	return m
}

// BenchmarkDecodeMemory reports the live heap a listing keeps after
// decoding each hostile reply of 16 MiB, per byte of reply (live/reply),
// beside what the generated types keep of the same bytes (std-live/reply)
// and what the whole listing keeps, its pods included (listing/reply).
func BenchmarkDecodeMemory(b *testing.B) {
	for _, h := range hostileReplies {
		raw := h.build(hostileSize)
		b.Run(h.name, func(b *testing.B) {
			var pleg, std, all uint64
			for b.Loop() {
				pleg = liveHeap(func() any { return decodeKept(b, raw, h.sandboxes) })
				std = liveHeap(func() any { return standardKept(b, raw, h.sandboxes) })
				all = liveHeap(func() any { return listingKept(b, raw, h.sandboxes) })
			}
			b.ReportMetric(float64(len(raw))/(1<<20), "reply-MiB")
			b.ReportMetric(float64(pleg)/(1<<20), "live-MiB")
			b.ReportMetric(float64(pleg)/float64(len(raw)), "live/reply")
			b.ReportMetric(float64(std)/float64(len(raw)), "std-live/reply")
			b.ReportMetric(float64(all)/float64(len(raw)), "listing/reply")
		})
	}
}

// TestDecodeMemoryBound: what a listing keeps after decoding a hostile
// reply is at most decodeBound times the reply's size, keptPerItem bytes
// per valid item it had not seen besides strings, and nothing for items
// that cannot be grouped.
//
// A valid item the memo had not seen costs its listed (112 bytes), its
// slot in the memo's table (24 bytes at 37.5–75 % load: 32–64) and its
// reference in the listing (16 bytes, up to 32 right after the slice
// grew): at most 208 bytes, 150–170 in practice, plus its strings. A
// string under internMin costs about its length (Go packs such allocations
// into shared 16-byte blocks; not under -race: 8 or 16 bytes), one from
// internMin on its table entry (40–80 bytes) besides, at most 5.5 times its
// bytes on the wire. The smallest valid item, a sandbox with a one-byte ID
// and pod UID and nothing else, takes 10 bytes of reply with its framing,
// and only 65,536 of those differ: a reply of a million distinct items
// needs 12 or more bytes an item, so two strings of under 16 bytes and
// keptPerItem = 240 bytes an item give decodeBound = 240/12 = 20. A
// repeated item costs its reference only; an item that cannot be grouped,
// nothing. The generated types keep 14–16 times the reply's size for the
// valid replies, 19–27 times for the invalid ones (BenchmarkDecodeMemory).
func TestDecodeMemoryBound(t *testing.T) {
	const keptPerItem, decodeBound = 240, 20
	const size = 512 << 10
	for _, h := range hostileReplies {
		raw := h.build(size)
		if len(raw) < size*9/10 {
			t.Fatalf("%s: reply of %d bytes, want about %d", h.name, len(raw), size)
		}
		live := liveHeap(func() any { return decodeKept(t, raw, h.sandboxes) })
		n, valid := countValid(t, raw, h.sandboxes)
		ratio := float64(live) / float64(len(raw))
		t.Logf("%-22s %7d items, %7d valid: %8d bytes live, %.2f x the reply", h.name, n, valid, live, ratio)
		if ratio > decodeBound {
			t.Errorf("%s: %d bytes live after decoding a reply of %d bytes (%.1f x), want at most %d x",
				h.name, live, len(raw), ratio, decodeBound)
		}
		// Items that cannot be grouped are not kept at all.
		if valid == 0 && live > 16<<10 {
			t.Errorf("%s: %d bytes live for %d items that cannot be grouped, want at most 16 KiB", h.name, live, n)
		}
		// The smallest items: at most keptPerItem each.
		if h.small && live > keptPerItem*uint64(valid) {
			t.Errorf("%s: %d bytes live for %d valid items, want at most %d each", h.name, live, valid, keptPerItem)
		}
	}
}

// countValid returns how many items the reply raw has, and how many of
// them can be grouped, by the generated types.
func countValid(t *testing.T, raw []byte, sandboxes bool) (n, valid int) {
	t.Helper()
	if sandboxes {
		var r runtimeapi.ListPodSandboxResponse
		if err := proto.Unmarshal(raw, &r); err != nil {
			t.Fatal(err)
		}
		for _, s := range r.Items {
			if it := sandboxItem(s); skipped(len(it.ID), it.meta, len(it.uid)) == skipNone {
				valid++
			}
		}
		return len(r.Items), valid
	}
	var r runtimeapi.ListContainersResponse
	if err := proto.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	for _, c := range r.Containers {
		if it := containerItem(c); skipped(len(it.ID), it.meta, len(it.uid)) == skipNone {
			valid++
		}
	}
	return len(r.Containers), valid
}
