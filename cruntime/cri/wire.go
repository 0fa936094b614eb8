package cri

import (
	"errors"
	"fmt"
	"hash/maphash"
	"sync"

	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the default "proto" codec
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
)

// The unfiltered list replies of a relist are decoded straight from the
// wire: only the fields the generator uses are read, label and annotation
// maps are never built (only the four io.kubernetes.* labels are looked
// at), and strings of 16 bytes or more that were in the previous reply are
// reused instead of allocated again. On a node with 1,000 pods of 10
// containers this is most of a steady-state relist's CPU and allocations
// (see `pleg bench`).
//
// What a reply makes pleg keep is bounded by its size whatever it holds:
// an item is read into views of the reply's bytes (wireItem) and nothing
// is allocated for it unless it can be grouped; then it costs at most 240
// bytes besides its strings, and the smallest item that can be grouped
// takes about 12 bytes of reply (TestDecodeMemoryBound).

// listed is one sandbox or container of a list reply, as grouping needs it.
// It is what the memo keeps per item between listings, so it is small: 112
// bytes, a size class of its own.
type listed struct {
	// Container is the item as a listing's pods hold it: they point here
	// (shared: read-only). A sandbox's Name is its pod's name; a
	// container's is its metadata's, else its io.kubernetes.container.name
	// label.
	cruntime.Container
	// uid, podName and podNamespace come from a sandbox's metadata, or
	// from a container's io.kubernetes.pod.* labels.
	uid, podName, podNamespace string
	meta                       bool // the item had metadata
	// committed says the item was in a complete listing, which the memo
	// committed: the pods built then may have it. (An item decoded by a
	// listing that failed is in the memo, but in no pod.)
	committed bool
}

// itemRef is one item of a reply being grouped: the decoded item, which an
// item of the memo is shared with the memo, not copied.
type itemRef struct {
	*listed
	// reused says the item is one of the last complete listing's, taken
	// from the memo, and the first of this listing with its bytes: a pod
	// whose items are all reused, and as many as last time, is last
	// time's pod.
	reused bool
}

// Field numbers of CRI v1 (api.proto).
const (
	fieldListItems = 1 // ListPodSandboxResponse.items, ListContainersResponse.containers

	fieldSandboxID          = 1
	fieldSandboxMetadata    = 2
	fieldSandboxState       = 3
	fieldSandboxCreatedAt   = 4
	fieldSandboxLabels      = 5
	fieldSandboxAnnotations = 6

	fieldContainerID          = 1
	fieldContainerMetadata    = 3
	fieldContainerImage       = 4
	fieldContainerState       = 6
	fieldContainerCreatedAt   = 7
	fieldContainerLabels      = 8
	fieldContainerAnnotations = 9

	fieldSandboxMetaName      = 1
	fieldSandboxMetaUID       = 2
	fieldSandboxMetaNamespace = 3
	fieldSandboxMetaAttempt   = 4

	fieldContainerMetaName    = 1
	fieldContainerMetaAttempt = 2

	fieldImageSpecImage = 1
	fieldMapKey         = 1
	fieldMapValue       = 2
)

var errMalformed = errors.New("malformed protobuf")

// walk calls f for every field of the message b; v holds a length-
// delimited field's bytes, x a varint's value. Other wire types are
// skipped. What it rejects is what the generated code rejects in a
// message's fields: a truncated or malformed field, a field number out of
// range, an end of group without its start.
func walk(b []byte, f func(num protowire.Number, v []byte, x uint64, varint bool) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num > protowire.MaxValidNumber {
			return errMalformed
		}
		b = b[n:]
		switch typ {
		case protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errMalformed
			}
			b = b[n:]
			if err := f(num, v, 0, false); err != nil {
				return err
			}
		case protowire.VarintType:
			x, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return errMalformed
			}
			b = b[n:]
			if err := f(num, nil, x, true); err != nil {
				return err
			}
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return errMalformed
			}
			b = b[n:]
		}
	}
	return nil
}

// interner reuses the strings of the previous reply: a steady node lists
// the same IDs and names every second.
type interner struct {
	mu   sync.Mutex
	prev map[string]string
}

// table is the interning state of one decode.
type table struct {
	prev, next map[string]string
}

func (in *interner) begin() *table {
	in.mu.Lock()
	prev := in.prev
	in.mu.Unlock()
	return &table{prev: prev, next: make(map[string]string, len(prev))}
}

func (in *interner) end(t *table) {
	in.mu.Lock()
	in.prev = t.next
	in.mu.Unlock()
}

// internMin is the length from which strings are interned. A shorter
// string costs less allocated on its own (Go packs allocations under 16
// bytes without pointers into shared 16-byte blocks) than the table entry
// that would share it, 40 to 80 bytes: interning short strings that do not
// repeat, such as a hostile reply's, would keep several times the reply's
// size. Short strings that repeat (a namespace such as "default") cost a
// few bytes per decoded item.
const internMin = 16

func (t *table) str(b []byte) string {
	if len(b) < internMin {
		return string(b)
	}
	if s, ok := t.prev[string(b)]; ok { // no allocation for the lookup
		t.next[s] = s
		return s
	}
	if s, ok := t.next[string(b)]; ok {
		return s
	}
	s := string(b)
	t.next[s] = s
	return s
}

// listReply is the target of a lean decode.
type listReply struct {
	sandboxes bool
	items     []itemRef // the valid items, in the reply's order
	strings   *table
	// memo, when set, holds the items of the previous listing: an item
	// with the same bytes is taken from it instead of decoded (memo.go).
	memo *itemMemo
	seed maphash.Seed
	// scratch holds an item split across the pieces of a reply.
	scratch []byte
	// slab holds the items decoded without a memo, a chunk at a time:
	// items point into it, so a chunk is never grown, only replaced.
	slab []listed
	// skipped counts the items left out, by reason, and firstSkipped is
	// the ID (possibly empty) and reason of the first.
	skipped      [numSkipReasons]int
	firstSkipped struct {
		id     string
		reason skipReason
	}
}

func decodeList(b []byte, r *listReply) error {
	return decodeListSlice(mem.BufferSlice{mem.SliceBuffer(b)}, r)
}

// decodeListSlice decodes a list reply as gRPC received it, in pieces,
// without first copying it into one buffer: an item that lies within one
// piece is read where it is, and only an item split across pieces is
// copied, into r.scratch.
func decodeListSlice(data mem.BufferSlice, r *listReply) error {
	return decodeListFrom(&pieceReader{data: data, rest: data.Len()}, r)
}

// decodeListFrom decodes one list reply from rd into r (a streamed
// listing's batches each in turn, into the same r). It rejects what the
// generated code rejects in the reply's own fields (see walk), and in an
// item's fields the generator reads.
func decodeListFrom(rd wireReader, r *listReply) error {
	for !rd.Done() {
		num, typ, ok := readTag(rd)
		if !ok || num > protowire.MaxValidNumber {
			return errMalformed
		}
		switch typ {
		case protowire.VarintType:
			if _, ok := rd.Varint(); !ok {
				return errMalformed
			}
		case protowire.BytesType:
			n, ok := rd.Varint()
			if !ok || n > uint64(rd.Left()) {
				return errMalformed
			}
			if num != fieldListItems {
				if !rd.Skip(int(n)) {
					return errMalformed
				}
				continue
			}
			v, ok := rd.Bytes(int(n), &r.scratch)
			if !ok {
				return errMalformed
			}
			if err := r.item(v); err != nil {
				return err
			}
		default:
			if !skipField(rd, num, typ, protowire.DefaultRecursionLimit) {
				return errMalformed
			}
		}
	}
	return nil
}

// item decodes one sandbox or container of a list reply, or takes it from
// the memo. Nothing is allocated for an item left out.
func (r *listReply) item(v []byte) error {
	var h uint64
	if r.memo != nil {
		maps := containerMaps
		if r.sandboxes {
			maps = sandboxMaps
		}
		it, hash, first, ok := r.memo.lookup(r.seed, v, maps)
		if ok {
			// Only after a failed listing may an item found be
			// uncommitted: else the item is not read.
			reused := first && (!r.memo.uncommitted || it.committed)
			r.items = append(r.items, itemRef{listed: it, reused: reused})
			return nil
		}
		h = hash
	}
	var w wireItem
	var err error
	if r.sandboxes {
		err = w.readSandbox(v)
	} else {
		err = w.readContainer(v)
	}
	if err != nil {
		return err
	}
	if why := skipped(len(w.id), w.meta, len(w.uid)); why != skipNone {
		if r.skipped == [numSkipReasons]int{} {
			r.firstSkipped.id, r.firstSkipped.reason = string(w.id), why
		}
		r.skipped[why]++
		return nil
	}
	var it *listed
	if r.memo != nil {
		it = &listed{}
	} else {
		if len(r.slab) == cap(r.slab) {
			r.slab = make([]listed, 0, 64)
		}
		r.slab = r.slab[:len(r.slab)+1]
		it = &r.slab[len(r.slab)-1]
	}
	w.keep(it, r.strings, r.sandboxes)
	if r.memo != nil {
		r.memo.add(h, v, it)
	}
	r.items = append(r.items, itemRef{listed: it})
	return nil
}

// skipReason says why an item cannot be grouped.
type skipReason uint8

const (
	skipNone       skipReason = iota
	skipNoID                  // an empty ID
	skipNoMetadata            // no metadata
	skipNoUID                 // no pod UID: a sandbox's metadata has none, a container no io.kubernetes.pod.uid label
	numSkipReasons
)

func (r skipReason) String() string {
	switch r {
	case skipNoID:
		return "empty ID"
	case skipNoMetadata:
		return "no metadata"
	case skipNoUID:
		return "no pod UID"
	}
	return "none"
}

// skipped says whether an item of the given ID and pod UID lengths, with or
// without metadata, is left out of a listing, and why.
func skipped(idLen int, meta bool, uidLen int) skipReason {
	switch {
	case idLen == 0:
		return skipNoID
	case !meta:
		return skipNoMetadata
	case uidLen == 0:
		return skipNoUID
	}
	return skipNone
}

// wireItem is an item of a list reply as read, before it is known to be
// kept: its strings are views of the reply's bytes.
type wireItem struct {
	id, name, labelName, uid, podName, podNamespace, image []byte

	createdAt int64
	attempt   uint32
	state     cruntime.State
	meta      bool
}

// keep fills it with w, its strings allocated or interned in t.
func (w *wireItem) keep(it *listed, t *table, sandbox bool) {
	name := w.name
	if len(name) == 0 {
		name = w.labelName
	}
	if sandbox {
		name = w.podName
	}
	podName := t.str(w.podName)
	*it = listed{
		Container: cruntime.Container{ID: t.str(w.id), Name: t.str(name), Attempt: w.attempt, State: w.state,
			Image: t.str(w.image), CreatedAt: w.createdAt},
		uid: t.str(w.uid), podName: podName, podNamespace: t.str(w.podNamespace), meta: w.meta,
	}
	if sandbox {
		it.Name = podName // one string
	}
}

// pieceReader reads a message held in the pieces of a mem.BufferSlice.
type pieceReader struct {
	data mem.BufferSlice
	i    int // current piece
	off  int // offset in it
	rest int // bytes left in all pieces
}

func (p *pieceReader) piece() []byte {
	for p.i < len(p.data) {
		if b := p.data[p.i].ReadOnlyData(); p.off < len(b) {
			return b[p.off:]
		}
		p.i++
		p.off = 0
	}
	return nil
}

func (p *pieceReader) Done() bool { return len(p.piece()) == 0 }

func (p *pieceReader) Left() int { return p.rest }

// advance moves past n bytes of the current piece.
func (p *pieceReader) advance(n int) {
	p.off += n
	p.rest -= n
}

func (p *pieceReader) Varint() (uint64, bool) {
	if b := p.piece(); len(b) > 0 {
		if x, n := protowire.ConsumeVarint(b); n > 0 {
			p.advance(n)
			return x, true
		}
	}
	// Split across pieces (or malformed): a byte at a time.
	var x uint64
	for shift := 0; shift < 64; shift += 7 {
		b := p.piece()
		if len(b) == 0 {
			return 0, false
		}
		if shift == 63 && b[0] > 1 {
			return 0, false // beyond 64 bits, as protowire.ConsumeVarint says
		}
		p.advance(1)
		x |= uint64(b[0]&0x7f) << shift
		if b[0] < 0x80 {
			return x, true
		}
	}
	return 0, false
}

// wireReader reads a message field by field: pieceReader from the pieces
// gRPC received, *directlist.Message from a body as it arrives.
type wireReader interface {
	// Done reports whether the message has no bytes left.
	Done() bool
	// Left is how many bytes the message has left.
	Left() int
	Varint() (uint64, bool)
	// Skip moves past n bytes.
	Skip(n int) bool
	// Bytes returns the next n bytes (n <= Left()): a view that is valid
	// until the next read, or a copy in *scratch.
	Bytes(n int, scratch *[]byte) ([]byte, bool)
}

// readTag reads a field's tag: its number is at least 1.
func readTag(rd wireReader) (protowire.Number, protowire.Type, bool) {
	x, ok := rd.Varint()
	if !ok {
		return 0, 0, false
	}
	num, typ := protowire.DecodeTag(x)
	return num, typ, num >= protowire.MinValidNumber
}

// skipField skips the value of a field of type typ whose tag was just
// read, as protowire.ConsumeFieldValue does: a group up to its matching
// end, nested at most depth deep.
func skipField(rd wireReader, num protowire.Number, typ protowire.Type, depth int) bool {
	switch typ {
	case protowire.VarintType:
		_, ok := rd.Varint()
		return ok
	case protowire.Fixed32Type:
		return rd.Left() >= 4 && rd.Skip(4)
	case protowire.Fixed64Type:
		return rd.Left() >= 8 && rd.Skip(8)
	case protowire.BytesType:
		n, ok := rd.Varint()
		return ok && n <= uint64(rd.Left()) && rd.Skip(int(n))
	case protowire.StartGroupType:
		if depth < 0 {
			return false
		}
		for {
			num2, typ2, ok := readTag(rd)
			if !ok {
				return false
			}
			if typ2 == protowire.EndGroupType {
				return num2 == num
			}
			if !skipField(rd, num2, typ2, depth-1) {
				return false
			}
		}
	}
	return false // an end of group without its start, or a reserved type
}

func (p *pieceReader) Skip(n int) bool {
	for n > 0 {
		b := p.piece()
		if len(b) == 0 {
			return false
		}
		k := min(n, len(b))
		p.advance(k)
		n -= k
	}
	return true
}

// Bytes returns the next n bytes (n <= Left()): where they are when in
// one piece, else copied into *scratch.
func (p *pieceReader) Bytes(n int, scratch *[]byte) ([]byte, bool) {
	if b := p.piece(); len(b) >= n {
		p.advance(n)
		return b[:n:n], true
	}
	out := (*scratch)[:0]
	for len(out) < n {
		b := p.piece()
		k := min(n-len(out), len(b))
		out = append(out, b[:k]...)
		p.advance(k)
	}
	*scratch = out
	return out, true
}

func (w *wireItem) readSandbox(b []byte) error {
	w.state = sandboxState(runtimeapi.PodSandboxState_SANDBOX_READY) // CRI's zero value
	return walk(b, func(num protowire.Number, v []byte, x uint64, varint bool) error {
		switch {
		case num == fieldSandboxID && !varint:
			w.id = v
		case num == fieldSandboxMetadata && !varint:
			w.meta = true
			return walk(v, func(num protowire.Number, v []byte, x uint64, varint bool) error {
				switch {
				case num == fieldSandboxMetaName && !varint:
					w.podName = v
				case num == fieldSandboxMetaUID && !varint:
					w.uid = v
				case num == fieldSandboxMetaNamespace && !varint:
					w.podNamespace = v
				case num == fieldSandboxMetaAttempt && varint:
					w.attempt = uint32(x)
				}
				return nil
			})
		case num == fieldSandboxState && varint:
			w.state = sandboxState(runtimeapi.PodSandboxState(int32(x)))
		case num == fieldSandboxCreatedAt && varint:
			w.createdAt = int64(x)
		}
		return nil
	})
}

func (w *wireItem) readContainer(b []byte) error {
	w.state = containerState(runtimeapi.ContainerState_CONTAINER_CREATED) // CRI's zero value
	return walk(b, func(num protowire.Number, v []byte, x uint64, varint bool) error {
		switch {
		case num == fieldContainerID && !varint:
			w.id = v
		case num == fieldContainerMetadata && !varint:
			w.meta = true
			return walk(v, func(num protowire.Number, v []byte, x uint64, varint bool) error {
				switch {
				case num == fieldContainerMetaName && !varint:
					w.name = v
				case num == fieldContainerMetaAttempt && varint:
					w.attempt = uint32(x)
				}
				return nil
			})
		case num == fieldContainerImage && !varint:
			return walk(v, func(num protowire.Number, v []byte, _ uint64, varint bool) error {
				if num == fieldImageSpecImage && !varint {
					w.image = v
				}
				return nil
			})
		case num == fieldContainerState && varint:
			w.state = containerState(runtimeapi.ContainerState(int32(x)))
		case num == fieldContainerCreatedAt && varint:
			w.createdAt = int64(x)
		case num == fieldContainerLabels && !varint:
			return w.readLabel(v)
		}
		return nil
	})
}

// readLabel reads one map entry of a container's labels, keeping the
// io.kubernetes.* ones grouping needs. Of a label given several times, the
// last counts.
func (w *wireItem) readLabel(b []byte) error {
	var key, value []byte
	err := walk(b, func(num protowire.Number, v []byte, _ uint64, varint bool) error {
		switch {
		case num == fieldMapKey && !varint:
			key = v
		case num == fieldMapValue && !varint:
			value = v
		}
		return nil
	})
	if err != nil {
		return err
	}
	switch string(key) {
	case cruntime.LabelPodUID:
		w.uid = value
	case cruntime.LabelPodName:
		w.podName = value
	case cruntime.LabelPodNamespace:
		w.podNamespace = value
	case cruntime.LabelContainerName:
		w.labelName = value
	}
	return nil
}

// leanCodec decodes *listReply and *eventReply targets from the wire and
// hands everything else to the default proto codec.
type leanCodec struct{}

// Name is empty on purpose. gRPC makes a forced codec's name the request's
// content subtype: "proto" would send content-type application/grpc+proto,
// and CRI-O serves its socket behind cmux, which closes a connection whose
// first request is not exactly application/grpc (so a pleg whose first call
// on a connection was a list or the event stream never reached CRI-O).
// With no name the request says application/grpc, as the default codec's
// do, and every runtime decodes it as protobuf.
func (leanCodec) Name() string { return "" }

func (leanCodec) Marshal(v any) (mem.BufferSlice, error) {
	return encoding.GetCodecV2("proto").Marshal(v)
}

func (leanCodec) Unmarshal(data mem.BufferSlice, v any) error {
	switch r := v.(type) {
	case *listReply:
		if err := decodeListSlice(data, r); err != nil {
			return fmt.Errorf("decoding the list reply: %w", err)
		}
		return nil
	case *discardReply:
		*r += discardReply(data.Len())
		return nil
	case *eventReply:
		if err := decodeEvent(data, r); err != nil {
			return fmt.Errorf("decoding a container event: %w", err)
		}
		return nil
	}
	return encoding.GetCodecV2("proto").Unmarshal(data, v)
}
