package criserve

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/journal"
)

// maxVerbose bounds the verbose answers kept: containerd's carry the OCI
// spec, ~10-20 KiB each, so 512 take at most ~10 MiB.
const maxVerbose = 512

// verboseCache keeps the runtime's verbose status answers while pleg's
// state of their item is unchanged (the key carries it), and makes the
// callers that ask for the same one at once share one runtime call: when
// every agent asks for a new container's verbose status, the runtime
// answers once.
type verboseCache struct {
	// stopping cancels every fetch (the server stops).
	stopping context.Context
	// fetches are the goroutines fetching; Serve waits for them.
	fetches sync.WaitGroup

	mu      sync.Mutex
	entries map[string]*verboseEntry
}

type verboseEntry struct {
	done      chan struct{} // closed when resp or err is set
	resp      any
	err       error
	waiters   int                // callers waiting for done
	cancel    context.CancelFunc // ends the fetch
	abandoned bool               // every waiter left: the fetch is cancelled
}

// get returns the answer for key, fetching it (once for every caller that
// asks for key meanwhile) unless it is kept. The fetch runs on its own
// goroutine, with ctx's values but not its end: it ends when the server
// stops, when it is done, or when every caller waiting for it has gone.
// A failed fetch is not kept: the next caller fetches again; but NotFound
// is: the runtime removed the item after pleg listed it, and its ID will
// not come back (when 50 agents ask for the verbose status of a container
// removed right after the event they got, the runtime answers once).
func (c *verboseCache) get(ctx context.Context, key string, fetch func(context.Context) (any, error)) (any, error) {
	c.mu.Lock()
	if c.entries == nil {
		c.entries = map[string]*verboseEntry{}
	}
	e, ok := c.entries[key]
	if !ok || e.abandoned {
		if len(c.entries) >= maxVerbose {
			// Start afresh: the answers of removed items go with the
			// others, which the next callers fetch again.
			for k, old := range c.entries {
				select {
				case <-old.done:
					delete(c.entries, k)
				default:
				}
			}
		}
		fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		stop := context.AfterFunc(c.stopping, cancel)
		e = &verboseEntry{done: make(chan struct{}), cancel: cancel}
		c.entries[key] = e
		c.fetches.Add(1)
		go func() {
			defer c.fetches.Done()
			resp, err := fetch(fctx)
			stop()
			cancel()
			c.mu.Lock()
			e.resp, e.err = resp, err
			if err != nil && status.Code(err) != codes.NotFound && c.entries[key] == e {
				delete(c.entries, key)
			}
			c.mu.Unlock()
			close(e.done)
		}()
	}
	e.waiters++
	c.mu.Unlock()
	select {
	case <-e.done:
		c.mu.Lock()
		e.waiters--
		c.mu.Unlock()
		return e.resp, e.err
	case <-ctx.Done():
		c.mu.Lock()
		e.waiters--
		if e.waiters == 0 {
			select {
			case <-e.done:
			default:
				e.abandoned = true
				e.cancel()
			}
		}
		c.mu.Unlock()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// verboseKey names an item's verbose answer in pleg's current state of it.
func verboseKey(method, id string, state fmt.Stringer) string {
	return method + "/" + id + "/" + state.String()
}

// typed returns v as T, or an Internal error.
func typed[T any](v any, err error) (T, error) {
	var zero T
	if err != nil {
		return zero, err
	}
	t, ok := v.(T)
	if !ok {
		return zero, status.Errorf(codes.Internal, "verbose cache: %T", v)
	}
	return t, nil
}

// DefaultVerboseStoreBytes bounds a VerboseStore's answers by default: a
// containerd verbose ContainerStatus is ~5 KiB (its OCI spec), so a node
// of 110 pods with two containers each takes ~1-2 MiB.
const DefaultVerboseStoreBytes = 16 << 20

// VerboseStore keeps the verbose ContainerStatus answers that pleg's own
// relisting got from the runtime (cri.WithVerboseStatuses: with a CRI
// endpoint on, its ContainerStatus calls are verbose), one per container,
// the last: the endpoint answers a client's verbose ContainerStatus from
// it, with no runtime call, when the kept answer's state is the
// container's state in pleg's journal, that is when pleg inspected the
// container after its last state change. Otherwise the call is passed
// through as before (and so are verbose PodSandboxStatus calls).
//
// It is bounded in bytes (the answers' encoded size): past the bound, the
// answers of items the journal does not have go first, then the oldest.
// Those of items the journal does not have are also dropped every
// verbosePruneEvery answers. An answer is kept before the journal has its
// item (the relist applies a status after it got it), so a pruning spares
// the answers kept since the one before. Safe for concurrent use; its
// methods do not block on I/O.
type VerboseStore struct {
	mu       sync.Mutex
	maxBytes int64
	bytes    int64
	seq      uint64
	puts     int
	// pruned is seq at the last pruning: only answers kept no later are
	// pruned.
	pruned uint64
	items  map[string]*storedVerbose // by verboseItem
	// age holds items in the order they were kept, the oldest first: an
	// eviction takes its head, a pruning walks its prefix.
	age verboseList
	// visited counts the answers an eviction or a pruning looked at
	// (tests: the work is linear in what goes).
	visited int
	// live returns the IDs of the journal's current items (nil until a
	// server using the store is made: nothing is pruned then).
	live func() map[string]bool
}

type storedVerbose struct {
	key        string
	id         string
	state      cruntime.State
	resp       proto.Message
	size       int64
	seq        uint64
	prev, next *storedVerbose // in VerboseStore.age
}

// verboseList is a doubly linked list of answers in the order they were
// kept (ascending seq): appended at the tail, removed anywhere in O(1).
type verboseList struct{ head, tail *storedVerbose }

func (l *verboseList) push(it *storedVerbose) {
	it.prev, it.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = it
	} else {
		l.head = it
	}
	l.tail = it
}

func (l *verboseList) remove(it *storedVerbose) {
	if it.prev != nil {
		it.prev.next = it.next
	} else {
		l.head = it.next
	}
	if it.next != nil {
		it.next.prev = it.prev
	} else {
		l.tail = it.prev
	}
	it.prev, it.next = nil, nil
}

// verbosePruneEvery is how many answers the store takes between two
// prunings of the items the journal no longer has.
const verbosePruneEvery = 64

// NewVerboseStore returns a store of at most maxBytes of answers
// (maxBytes <= 0: DefaultVerboseStoreBytes).
func NewVerboseStore(maxBytes int64) *VerboseStore {
	if maxBytes <= 0 {
		maxBytes = DefaultVerboseStoreBytes
	}
	return &VerboseStore{maxBytes: maxBytes, items: map[string]*storedVerbose{}}
}

func verboseItem(method, id string) string { return method + "/" + id }

// ContainerVerbose keeps a verbose ContainerStatus answer of container id
// in state (cri.VerboseSink).
func (v *VerboseStore) ContainerVerbose(id string, state cruntime.State, resp *runtimeapi.ContainerStatusResponse) {
	v.put("ContainerStatus", id, state, resp)
}

func (v *VerboseStore) put(method, id string, state cruntime.State, resp proto.Message) {
	if v == nil || id == "" || state == cruntime.StateUnknown {
		// An unknown state may become any other: its answer is not
		// tied to one.
		return
	}
	size := int64(proto.Size(resp))
	v.mu.Lock()
	key := verboseItem(method, id)
	if old := v.items[key]; old != nil {
		v.dropLocked(old)
	}
	if size > v.maxBytes {
		v.mu.Unlock()
		return
	}
	v.seq++
	it := &storedVerbose{key: key, id: id, state: state, resp: resp, size: size, seq: v.seq}
	v.items[key] = it
	v.age.push(it)
	v.bytes += size
	v.puts++
	live, upTo := v.live, v.seq
	due := live != nil && (v.puts%verbosePruneEvery == 0 || v.bytes > v.maxBytes)
	v.mu.Unlock()

	// The journal's items are read without the store's lock held: the
	// scan is over every pod, and the store's readers (the CRI
	// endpoint's calls) and writers (the relist's status calls) do not
	// wait for it.
	var ids map[string]bool
	if due {
		ids = live()
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if due {
		v.pruneLocked(ids, upTo)
	}
	for v.bytes > v.maxBytes && v.age.head != nil {
		v.visited++
		v.dropLocked(v.age.head) // the oldest
	}
}

// dropLocked forgets it.
func (v *VerboseStore) dropLocked(it *storedVerbose) {
	v.bytes -= it.size
	delete(v.items, it.key)
	v.age.remove(it)
}

// pruneLocked drops the answers of items not in live (the journal's,
// read when the store had kept answers up to upTo), those kept since the
// last pruning excepted (their items may be on their way to the
// journal).
func (v *VerboseStore) pruneLocked(live map[string]bool, upTo uint64) {
	// The answers kept no later than the last pruning are age's prefix.
	for it := v.age.head; it != nil && it.seq <= v.pruned; {
		v.visited++
		next := it.next
		if !live[it.id] {
			v.dropLocked(it)
		}
		it = next
	}
	if upTo > v.pruned {
		v.pruned = upTo
	}
}

// get returns the kept answer of method for item id when it was got in
// state.
func (v *VerboseStore) get(method, id string, state cruntime.State) (proto.Message, bool) {
	if v == nil {
		return nil, false
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	it := v.items[verboseItem(method, id)]
	if it == nil || it.state != state {
		return nil, false
	}
	return it.resp, true
}

// watch makes the store prune against j's current items.
func (v *VerboseStore) watch(j *journal.Journal) {
	live := func() map[string]bool {
		pods, _ := j.Pods(nil)
		ids := map[string]bool{}
		for _, p := range pods {
			for i := range p.Sandboxes {
				ids[p.Sandboxes[i].ID] = true
			}
			for i := range p.Containers {
				ids[p.Containers[i].ID] = true
			}
		}
		return ids
	}
	v.mu.Lock()
	v.live = live
	v.mu.Unlock()
}

// size returns the answers kept and their bytes (tests).
func (v *VerboseStore) size() (int, int64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.items), v.bytes
}
