package cri

import (
	"errors"
	"fmt"
	"google.golang.org/grpc/mem"
	"hash/maphash"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
)

// The fuzz targets compare what pleg keeps with what the standard protobuf
// decoder (google.golang.org/protobuf, with cri-api's generated types)
// makes of the same bytes:
//
//   - FuzzWireDecode: one list reply, whole, in pieces and through a memo;
//   - FuzzListingMemo: a sequence of listings through one memo, the
//     replies in pieces, grouped into pods;
//   - FuzzContainerStatus, FuzzPodSandboxStatus, FuzzContainerEvent: the
//     conversions of the status and event replies.
//
// pleg's list decoder reads only the fields grouping needs and reads
// strings as bytes. So beside the generated types, the list targets decode
// each reply with "the lenient schema": cri-api's own descriptors cut down
// to those fields, strings made bytes and label maps repeated entries
// (dynamicpb). Whatever the generated types accept, the lenient schema
// accepts too, with the same fields; pleg must accept exactly what the
// lenient schema accepts (an error of the class errMalformed otherwise)
// and keep the same items. Where the generated types reject a reply pleg
// accepts, the reason lies outside what pleg reads (a string that is not
// UTF-8, a malformed annotation): pleg does not validate what it does not
// read.
//
// The committed corpus is in testdata/fuzz/<target>/; `go test` runs it.
// TestFuzzSeeds checks that the generated seeds are in it and writes them
// with -write-seeds.

// lenientSchema holds the lenient message types.
type lenientSchema struct {
	list, item map[bool]protoreflect.MessageType // by sandboxes
}

var lenient = newLenientSchema()

func newLenientSchema() *lenientSchema {
	file := protodesc.ToFileDescriptorProto((&runtimeapi.PodSandbox{}).ProtoReflect().Descriptor().ParentFile())
	const pkg = "pleg.lenient"
	keep := map[string][]string{
		"ListPodSandboxResponse": {"items"},
		"ListContainersResponse": {"containers"},
		"PodSandbox":             {"id", "metadata", "state", "created_at"},
		"PodSandboxMetadata":     {"name", "uid", "namespace", "attempt"},
		"Container":              {"id", "metadata", "image", "state", "created_at", "labels"},
		"ContainerMetadata":      {"name", "attempt"},
		"ImageSpec":              {"image"},
	}
	out := &descriptorpb.FileDescriptorProto{Name: proto.String("pleg-lenient.proto"),
		Package: proto.String(pkg), Syntax: proto.String("proto3")}
	cut := func(m *descriptorpb.DescriptorProto, names []string) *descriptorpb.DescriptorProto {
		nm := &descriptorpb.DescriptorProto{Name: m.Name}
		for _, f := range m.Field {
			if !slices.Contains(names, f.GetName()) {
				continue
			}
			f = proto.CloneOf(f)
			switch f.GetType() {
			case descriptorpb.FieldDescriptorProto_TYPE_STRING:
				f.Type = descriptorpb.FieldDescriptorProto_TYPE_BYTES.Enum()
			case descriptorpb.FieldDescriptorProto_TYPE_ENUM:
				// An open enum decodes as an int32.
				f.Type, f.TypeName = descriptorpb.FieldDescriptorProto_TYPE_INT32.Enum(), nil
			case descriptorpb.FieldDescriptorProto_TYPE_MESSAGE:
				f.TypeName = proto.String(strings.Replace(f.GetTypeName(), ".runtime.v1.", "."+pkg+".", 1))
			}
			nm.Field = append(nm.Field, f)
		}
		if len(nm.Field) != len(names) {
			panic(fmt.Sprintf("lenient schema: %s has %d of the fields %v", m.GetName(), len(nm.Field), names))
		}
		return nm
	}
	for _, m := range file.MessageType {
		names, ok := keep[m.GetName()]
		if !ok {
			continue
		}
		nm := cut(m, names)
		if m.GetName() == "Container" {
			for _, n := range m.NestedType {
				if n.GetName() == "LabelsEntry" {
					// A map whose keys are bytes is repeated entries.
					e := cut(n, []string{"key", "value"})
					nm.NestedType = append(nm.NestedType, e)
				}
			}
		}
		out.MessageType = append(out.MessageType, nm)
	}
	fd, err := protodesc.NewFile(out, nil)
	if err != nil {
		panic(err)
	}
	msg := func(name string) protoreflect.MessageType {
		d := fd.Messages().ByName(protoreflect.Name(name))
		if d == nil {
			panic("lenient schema: no " + name)
		}
		return dynamicpb.NewMessageType(d)
	}
	return &lenientSchema{
		list: map[bool]protoreflect.MessageType{true: msg("ListPodSandboxResponse"), false: msg("ListContainersResponse")},
		item: map[bool]protoreflect.MessageType{true: msg("PodSandbox"), false: msg("Container")},
	}
}

// get returns the value at path (field names joined by dots) in m; a
// message absent on the way reads as empty.
func get(m protoreflect.Message, path string) protoreflect.Value {
	names := strings.Split(path, ".")
	for i, n := range names {
		fd := m.Descriptor().Fields().ByName(protoreflect.Name(n))
		if fd == nil {
			panic(fmt.Sprintf("%s has no field %s", m.Descriptor().FullName(), n))
		}
		if i == len(names)-1 {
			return m.Get(fd)
		}
		m = m.Get(fd).Message()
	}
	panic("empty path")
}

// has says whether the message field at path of m is present.
func has(m protoreflect.Message, path string) bool {
	i := strings.LastIndexByte(path, '.')
	if i >= 0 {
		m, path = get(m, path[:i]).Message(), path[i+1:]
	}
	return m.Has(m.Descriptor().Fields().ByName(protoreflect.Name(path)))
}

// lenientItem converts an item decoded with the lenient schema, as
// grouping sees it, and says whether it can be grouped.
func lenientItem(m protoreflect.Message, sandboxes bool) (listed, bool) {
	s := func(path string) string { return string(get(m, path).Bytes()) }
	it := listed{Container: cruntime.Container{ID: s("id"), CreatedAt: get(m, "created_at").Int(),
		Attempt: uint32(get(m, "metadata.attempt").Uint())}, meta: has(m, "metadata")}
	state := int32(get(m, "state").Int())
	if sandboxes {
		it.podName, it.uid, it.podNamespace = s("metadata.name"), s("metadata.uid"), s("metadata.namespace")
		it.Name = it.podName // a sandbox is named after its pod
		it.State = sandboxState(runtimeapi.PodSandboxState(state))
	} else {
		it.Name, it.Image = s("metadata.name"), s("image.image")
		it.State = containerState(runtimeapi.ContainerState(state))
		labels := map[string]string{}
		entries := get(m, "labels").List()
		for i := range entries.Len() {
			e := entries.Get(i).Message()
			labels[string(get(e, "key").Bytes())] = string(get(e, "value").Bytes()) // the last counts
		}
		it.uid, it.podName, it.podNamespace = labels[cruntime.LabelPodUID], labels[cruntime.LabelPodName], labels[cruntime.LabelPodNamespace]
		if it.Name == "" {
			it.Name = labels[cruntime.LabelContainerName]
		}
	}
	return it, skipped(len(it.ID), it.meta, len(it.uid)) == skipNone
}

// lenientList decodes a list reply with the lenient schema and returns the
// items that can be grouped.
func lenientList(b []byte, sandboxes bool) ([]listed, error) {
	m := lenient.list[sandboxes].New()
	if err := proto.Unmarshal(b, m.Interface()); err != nil {
		return nil, err
	}
	fd := m.Descriptor().Fields().ByNumber(1)
	var out []listed
	items := m.Get(fd).List()
	for i := range items.Len() {
		if it, ok := lenientItem(items.Get(i).Message(), sandboxes); ok {
			out = append(out, it)
		}
	}
	return out, nil
}

// standardList decodes a list reply with the generated types and returns
// the items that can be grouped.
func standardList(b []byte, sandboxes bool) ([]listed, error) {
	var out []listed
	keep := func(it listed) {
		if skipped(len(it.ID), it.meta, len(it.uid)) == skipNone {
			out = append(out, it)
		}
	}
	if sandboxes {
		var r runtimeapi.ListPodSandboxResponse
		if err := proto.Unmarshal(b, &r); err != nil {
			return nil, err
		}
		for _, s := range r.Items {
			keep(sandboxItem(s))
		}
		return out, nil
	}
	var r runtimeapi.ListContainersResponse
	if err := proto.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	for _, c := range r.Containers {
		keep(containerItem(c))
	}
	return out, nil
}

// values returns the items' values, as they are whether taken from a memo
// or not.
func values(items []itemRef) []listed {
	var out []listed
	for _, it := range items {
		v := *it.listed
		v.committed = false
		out = append(out, v)
	}
	return out
}

// checkDecodeError fails unless err is nil or of the class errMalformed.
func checkDecodeError(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil && !errors.Is(err, errMalformed) {
		t.Fatalf("%s: error %v is not errMalformed", what, err)
	}
}

// FuzzWireDecode: one list reply, decoded whole, in pieces, and in pieces
// through a memo, keeps what the lenient schema and the generated types
// keep, or fails where the lenient schema fails.
func FuzzWireDecode(f *testing.F) {
	f.Add([]byte{0x0a, 0xff}, false, uint64(0))
	f.Fuzz(func(t *testing.T, b []byte, sandboxes bool, cut uint64) {
		rng := rand.New(rand.NewPCG(cut, 1))
		maxPiece := 1 + int(cut%61)

		whole := listReply{sandboxes: sandboxes, strings: (&interner{}).begin()}
		errWhole := decodeList(b, &whole)
		checkDecodeError(t, "whole", errWhole)
		split := listReply{sandboxes: sandboxes, strings: (&interner{}).begin()}
		errSplit := decodeListSlice(pieces(rng, b, maxPiece), &split)
		checkDecodeError(t, "in pieces", errSplit)
		m := &memo{}
		l := startListing(m)
		withMemo := &l.containers
		if sandboxes {
			withMemo = &l.sandboxes
		}
		errMemo := decodeListSlice(pieces(rng, b, maxPiece), withMemo)
		checkDecodeError(t, "with a memo", errMemo)
		if (errWhole == nil) != (errSplit == nil) {
			t.Fatalf("whole: %v; in pieces of %d: %v", errWhole, maxPiece, errSplit)
		}
		bufSize := 16 + int(cut%67)
		streamed := listReply{sandboxes: sandboxes, strings: (&interner{}).begin()}
		errStreamed := decodeStreamed(b, bufSize, &streamed)
		checkDecodeError(t, "as it arrives", errStreamed)
		if (errWhole == nil) != (errStreamed == nil) {
			t.Fatalf("whole: %v; as it arrives, read buffer %d: %v", errWhole, bufSize, errStreamed)
		}
		// Through the memo, an item whose key and length are those of
		// an item before it is that item (memo.go), whatever its labels
		// and annotations: the memo's contract.
		var shadow shadowMemo
		wantMemo, _, errShadow := shadow.reply(m.seed, b, sandboxes, 0)
		if (errMemo == nil) != (errShadow == nil) {
			t.Fatalf("with a memo: %v; the memo's contract: %v", errMemo, errShadow)
		}
		if errMemo == nil && !reflect.DeepEqual(values(withMemo.items), wantMemo) {
			t.Fatalf("with a memo\n%+v\nthe memo's contract\n%+v", values(withMemo.items), wantMemo)
		}

		want, errLenient := lenientList(b, sandboxes)
		if (errLenient == nil) != (errWhole == nil) {
			t.Fatalf("pleg: %v; the lenient schema: %v", errWhole, errLenient)
		}
		std, errStd := standardList(b, sandboxes)
		if errStd == nil && errLenient != nil {
			t.Fatalf("the generated types accept what the lenient schema rejects: %v", errLenient)
		}
		if errWhole != nil {
			return
		}
		got := values(whole.items)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("pleg kept\n%+v\nthe lenient schema\n%+v", got, want)
		}
		if errStd == nil && !reflect.DeepEqual(got, std) {
			t.Fatalf("pleg kept\n%+v\nthe generated types\n%+v", got, std)
		}
		if s := values(split.items); !reflect.DeepEqual(s, got) {
			t.Fatalf("in pieces of %d\n%+v\nwhole\n%+v", maxPiece, s, got)
		}
		if s := values(streamed.items); !reflect.DeepEqual(s, got) {
			t.Fatalf("as it arrives, read buffer %d\n%+v\nwhole\n%+v", bufSize, s, got)
		}
	})
}

// A fuzzed sequence of listings is encoded as replies one after another,
// a listing's sandboxes then its containers: each reply is one byte, the
// size of the pieces it arrives in less one, then its length as a varint
// and its bytes.
const maxFuzzListings = 8

type fuzzReply struct {
	maxPiece int
	b        []byte
}

func readListings(data []byte) [][2]fuzzReply {
	var out [][2]fuzzReply
	for len(data) > 0 && len(out) < maxFuzzListings {
		var l [2]fuzzReply
		for k := range l {
			if len(data) == 0 {
				break
			}
			l[k].maxPiece = 1 + int(data[0])
			data = data[1:]
			n, m := protowire.ConsumeVarint(data)
			if m < 0 {
				n, m = uint64(len(data)), 0
			}
			data = data[m:]
			n = min(n, uint64(len(data)))
			l[k].b, data = data[:n], data[n:]
		}
		out = append(out, l)
	}
	return out
}

func writeListings(listings ...[2]fuzzReply) []byte {
	var out []byte
	for _, l := range listings {
		for _, r := range l {
			out = append(out, byte(r.maxPiece-1))
			out = protowire.AppendBytes(out, r.b)
		}
	}
	return out
}

// shadowMemo is the memo's contract, as a model: an item whose key
// (itemKey) and length are those of an item in the memo is that item, as
// it was decoded; an item decoded that can be grouped is added; a complete
// listing drops the items it did not have.
type shadowMemo struct {
	entries map[uint64]*shadowEntry
}

type shadowEntry struct {
	size int
	it   listed
	seen int
}

// reply returns the items the memo's contract gives for the reply b of
// listing gen, and whether any was found in the memo.
func (s *shadowMemo) reply(seed maphash.Seed, b []byte, sandboxes bool, gen int) (items []listed, found bool, err error) {
	if s.entries == nil {
		s.entries = map[uint64]*shadowEntry{}
	}
	maps := containerMaps
	if sandboxes {
		maps = sandboxMaps
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num > protowire.MaxValidNumber {
			return nil, found, errMalformed
		}
		b = b[n:]
		if num != 1 || typ != protowire.BytesType {
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, found, errMalformed
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, found, errMalformed
		}
		b = b[n:]
		h := itemKey(seed, v, maps)
		if e := s.entries[h]; e != nil && e.size == len(v) {
			e.seen, found = gen, true
			items = append(items, e.it)
			continue
		}
		m := lenient.item[sandboxes].New()
		if err := proto.Unmarshal(v, m.Interface()); err != nil {
			return nil, found, err
		}
		it, ok := lenientItem(m, sandboxes)
		if !ok {
			continue
		}
		s.entries[h] = &shadowEntry{size: len(v), it: it, seen: gen}
		items = append(items, it)
	}
	return items, found, nil
}

// commit drops the entries listing gen did not have.
func (s *shadowMemo) commit(gen int) {
	for h, e := range s.entries {
		if e.seen != gen {
			delete(s.entries, h)
		}
	}
}

// FuzzListingMemo: a sequence of listings made through one memo, each
// reply in pieces, gives the pods that grouping the memo contract's items
// gives; a listing fails where the lenient schema fails on an item the
// memo does not have, or on the reply's own fields.
func FuzzListingMemo(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		c, m := &Client{}, &memo{}
		var shadow [2]shadowMemo // by sandboxes
		rng := rand.New(rand.NewPCG(uint64(len(data)), 2))
		for gen, l := range readListings(data) {
			lst := startListing(m)
			var want [2][]listed
			var err, wantErr error
			for k, sandboxes := range []bool{true, false} {
				r := &lst.containers
				if sandboxes {
					r = &lst.sandboxes
				}
				reply := l[k]
				var found bool
				want[k], found, wantErr = shadow[k].reply(m.seed, reply.b, sandboxes, gen)
				err = decodeListSlice(pieces(rng, reply.b, reply.maxPiece), r)
				checkDecodeError(t, fmt.Sprintf("listing %d", gen), err)
				if (err == nil) != (wantErr == nil) {
					t.Fatalf("listing %d, sandboxes=%v: pleg %v, the memo's contract %v", gen, sandboxes, err, wantErr)
				}
				if !found {
					// The model's own check: without the memo, it is
					// the lenient schema.
					lw, lerr := lenientList(reply.b, sandboxes)
					if (lerr == nil) != (wantErr == nil) || (lerr == nil && !reflect.DeepEqual(lw, want[k])) {
						t.Fatalf("listing %d: the model %v %+v, the lenient schema %v %+v", gen, wantErr, want[k], lerr, lw)
					}
				}
				if err != nil {
					break
				}
			}
			if err != nil {
				continue // the listing failed: the memo keeps what it decoded
			}
			got := c.endListing(lst)
			shadow[0].commit(gen)
			shadow[1].commit(gen)
			wantPods := c.group(refs(want[0]...), refs(want[1]...), &groupScratch{}, nil)
			if !reflect.DeepEqual(sortedItems(got), sortedItems(wantPods)) {
				t.Fatalf("listing %d: pleg\n%s\nthe memo's contract\n%s", gen, dump(got), dump(wantPods))
			}
			if m.sandboxes.items.len() != len(shadow[0].entries) || m.containers.items.len() != len(shadow[1].entries) {
				t.Fatalf("listing %d: the memo holds %d sandboxes and %d containers, its contract %d and %d", gen,
					m.sandboxes.items.len(), m.containers.items.len(), len(shadow[0].entries), len(shadow[1].entries))
			}
		}
	})
}

// nsTimeRef is CRI's nanoseconds as a time: 0 is none.
func nsTimeRef(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// firstOf returns the first of ss that is not empty.
func firstOf(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

// mapValue returns the value of key in the map field at path of m.
func mapValue(m protoreflect.Message, path, key string) string {
	v := get(m, path).Map().Get(protoreflect.ValueOfString(key).MapKey())
	if !v.IsValid() {
		return ""
	}
	return v.String()
}

// mapOf returns the map field at path of m (nil when it has no entry).
func mapOf(m protoreflect.Message, path string) map[string]string {
	mp := get(m, path).Map()
	if mp.Len() == 0 {
		return nil
	}
	out := make(map[string]string, mp.Len())
	mp.Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
		out[k.String()] = v.String()
		return true
	})
	return out
}

// sameString says whether a and b are one string in memory.
func sameString(a, b string) bool {
	return len(a) == len(b) && (len(a) == 0 || unsafe.StringData(a) == unsafe.StringData(b))
}

// FuzzContainerStatus: the status pleg keeps of a ContainerStatus is its
// fields read by name, the listed container's where the status has none,
// sharing the listing's strings where they are equal.
func FuzzContainerStatus(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte, id, name, image string) {
		var s runtimeapi.ContainerStatus
		if proto.Unmarshal(b, &s) != nil {
			return // no status to convert: the call fails
		}
		ct := &cruntime.Container{ID: id, Name: name, Image: image}
		got := convertContainer(&s, ct, cruntime.NewLabels)
		m := s.ProtoReflect()
		str := func(path string) string { return get(m, path).String() }
		want := &cruntime.ContainerStatus{
			ID:          firstOf(str("id"), id),
			Name:        firstOf(str("metadata.name"), mapValue(m, "labels", cruntime.LabelContainerName), name),
			Attempt:     uint32(get(m, "metadata.attempt").Uint()),
			State:       containerState(runtimeapi.ContainerState(get(m, "state").Enum())),
			Image:       str("image.image"),
			ImageRef:    str("image_ref"),
			CreatedAt:   nsTimeRef(get(m, "created_at").Int()),
			StartedAt:   nsTimeRef(get(m, "started_at").Int()),
			FinishedAt:  nsTimeRef(get(m, "finished_at").Int()),
			ExitCode:    int32(get(m, "exit_code").Int()),
			Reason:      str("reason"),
			Message:     str("message"),
			Labels:      cruntime.NewLabels(mapOf(m, "labels")),
			Annotations: cruntime.NewLabels(mapOf(m, "annotations")),
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("pleg keeps\n%+v\nthe status says\n%+v", got, want)
		}
		for _, p := range [][2]string{{got.ID, id}, {got.Name, name}, {got.Image, image}} {
			if p[0] == p[1] && !sameString(p[0], p[1]) {
				t.Errorf("%q is kept twice, not shared with the listing", p[0])
			}
		}
	})
}

// FuzzPodSandboxStatus: the status pleg keeps of a PodSandboxStatus is its
// fields read by name.
func FuzzPodSandboxStatus(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte, id string) {
		var s runtimeapi.PodSandboxStatus
		if proto.Unmarshal(b, &s) != nil {
			return
		}
		sb := &cruntime.Container{ID: id}
		got := convertSandbox(&s, sb, cruntime.NewLabels)
		m := s.ProtoReflect()
		var ips []string
		if ip := get(m, "network.ip").String(); ip != "" {
			ips = append(ips, ip)
		}
		more := get(m, "network.additional_ips").List()
		for i := range more.Len() {
			if ip := get(more.Get(i).Message(), "ip").String(); ip != "" {
				ips = append(ips, ip)
			}
		}
		mode := get(m, "linux.namespaces.options.network").Enum()
		want := &cruntime.SandboxStatus{
			ID:          firstOf(get(m, "id").String(), id),
			State:       sandboxState(runtimeapi.PodSandboxState(get(m, "state").Enum())),
			CreatedAt:   nsTimeRef(get(m, "created_at").Int()),
			Attempt:     uint32(get(m, "metadata.attempt").Uint()),
			IPs:         ips,
			HostNetwork: runtimeapi.NamespaceMode(mode).String() == "NODE",
			Labels:      cruntime.NewLabels(mapOf(m, "labels")),
			Annotations: cruntime.NewLabels(mapOf(m, "annotations")),
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("pleg keeps\n%+v\nthe status says\n%+v", got, want)
		}
		if got.ID == id && !sameString(got.ID, id) {
			t.Errorf("%q is kept twice, not shared with the listing", id)
		}
	})
}

// FuzzContainerEvent: the event pleg makes of a ContainerEventResponse is
// its fields read by name; the pod is the sandbox status's, else the first
// container status's labels'.
func FuzzContainerEvent(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		var r runtimeapi.ContainerEventResponse
		if proto.Unmarshal(b, &r) != nil {
			return
		}
		got := eventFrom(&r)
		m := r.ProtoReflect()
		typ := get(m, "container_event_type").Enum()
		want := cruntime.Event{
			ContainerID: get(m, "container_id").String(),
			Type:        cruntime.EventType(typ),
			CreatedAt:   nsTimeRef(get(m, "created_at").Int()),
		}
		// The enum's names, in pleg's terms.
		if v := m.Descriptor().Fields().ByName("container_event_type").Enum().Values().ByNumber(typ); v != nil {
			name := string(v.Name())
			want.Type = map[string]cruntime.EventType{
				"CONTAINER_CREATED_EVENT": cruntime.EventCreated, "CONTAINER_STARTED_EVENT": cruntime.EventStarted,
				"CONTAINER_STOPPED_EVENT": cruntime.EventStopped, "CONTAINER_DELETED_EVENT": cruntime.EventDeleted,
			}[name]
		}
		if uid := get(m, "pod_sandbox_status.metadata.uid").String(); uid != "" {
			want.PodUID = types.UID(uid)
			want.PodName = get(m, "pod_sandbox_status.metadata.name").String()
			want.PodNamespace = get(m, "pod_sandbox_status.metadata.namespace").String()
		} else if sts := get(m, "containers_statuses").List(); sts.Len() > 0 {
			st := sts.Get(0).Message()
			if uid := mapValue(st, "labels", cruntime.LabelPodUID); uid != "" {
				want.PodUID = types.UID(uid)
				want.PodName = mapValue(st, "labels", cruntime.LabelPodName)
				want.PodNamespace = mapValue(st, "labels", cruntime.LabelPodNamespace)
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("pleg makes\n%+v\nthe event says\n%+v", got, want)
		}
		// The event stream reads the same from the wire (eventReply)
		// as from the decoded message.
		var lean eventReply
		if err := decodeEvent(mem.BufferSlice{mem.SliceBuffer(b)}, &lean); err != nil || !reflect.DeepEqual(lean.ev, want) {
			t.Fatalf("read from the wire: %+v, %v\nthe event says\n%+v", lean.ev, err, want)
		}
	})
}
