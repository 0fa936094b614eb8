// Package journal is the node's lifecycle stream as pleg keeps it: every
// pod change and runtime status change, numbered in order, retained for a
// bounded count and age, and the current state of every pod. Any number of
// watchers read it, each at its own pace: without a cursor a watcher gets
// every current pod (a snapshot), an end-of-snapshot marker, then the
// changes; with a cursor it gets exactly the changes after it, or, when the
// cursor cannot be resumed from (another pleg instance, or older than the
// retention), an explicit resync-required message, never a silent gap.
//
// The generator appends (Append never blocks and never waits for a
// watcher); watchers hold no buffer of their own: they read the shared
// retained entries, so an idle or slow watcher costs its position and
// nothing else. A watcher that falls behind the retention is told to
// resync. docs/stream.md states the contract.
package journal

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/internal/textfmt"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// Defaults of Options.
const (
	DefaultSize             = 10000
	DefaultMaxBytes         = 16 << 20
	DefaultMaxAge           = 15 * time.Minute
	DefaultBookmarkInterval = 10 * time.Second
)

// Options configure a Journal.
type Options struct {
	// Size is how many entries are retained (default DefaultSize).
	Size int
	// MaxBytes bounds the retained entries' estimated memory (default
	// DefaultMaxBytes): the oldest go first.
	MaxBytes int
	// MaxAge is how long an entry, and a removed container's tombstone,
	// is retained at most (default DefaultMaxAge). Tombstones are kept
	// by age, not by count: a busy node's stream of entries does not
	// evict them; their own estimated memory is bounded by MaxBytes too
	// (the oldest go first).
	MaxAge time.Duration
	// BookmarkInterval is how long a watcher waits for a message before
	// it gets a bookmark (default DefaultBookmarkInterval).
	BookmarkInterval time.Duration
	// Clock stamps entries appended without a time and drives bookmarks;
	// the real clock when nil.
	Clock clock.WithTicker
	// Epoch names this journal in cursors; random when empty.
	Epoch string
	// OnIdentityWanted, when set, is called (without the journal's lock)
	// when the first watcher that asked for identities opens (true) and
	// when the last one closes (false): the generator fetches identities
	// only in between. Calls never overlap, each tells the wish as it
	// stands when it is made, and only when it differs from the last one
	// told: the last call tells the current wish, however Watch and Close
	// race. A slow call delays no Watch or Close (the call that is being
	// made tells the changes made meanwhile, after it returns).
	OnIdentityWanted func(bool)
}

// Journal is the lifecycle stream of one generator. It is safe for
// concurrent use.
type Journal struct {
	size     int
	maxBytes int
	maxAge   time.Duration
	bookmark time.Duration
	clock    clock.WithTicker
	epoch    string

	mu      sync.Mutex
	ring    []*Entry // the retained entries, oldest first, in a circular buffer
	start   int      // index of the oldest in ring
	n       int      // entries in ring
	bytes   int      // their estimated size
	head    uint64   // the last sequence number given
	pods    map[types.UID]*Pod
	removed map[string]*Tombstone // container or sandbox ID -> its removal
	gone    []string              // removed's keys in removal order
	dead    int                   // the tombstones' estimated size
	changed chan struct{}         // closed and replaced on every Append
	last    time.Time             // the last entry's time: no entry is earlier
	watches map[*Watcher]struct{}
	// identities counts the open watchers that asked for identities;
	// onIdentity is told when it leaves or reaches zero.
	identities int
	onIdentity func(bool)
	// telling: a tellIdentity call is telling; told: the last wish told.
	telling, told bool
}

// New returns an empty journal.
func New(o Options) *Journal {
	if o.Size <= 0 {
		o.Size = DefaultSize
	}
	if o.MaxAge <= 0 {
		o.MaxAge = DefaultMaxAge
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.BookmarkInterval <= 0 {
		o.BookmarkInterval = DefaultBookmarkInterval
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Epoch == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		o.Epoch = hex.EncodeToString(b[:])
	}
	return &Journal{size: o.Size, maxBytes: o.MaxBytes, maxAge: o.MaxAge, bookmark: o.BookmarkInterval, clock: o.Clock, epoch: o.Epoch,
		ring: make([]*Entry, o.Size), pods: make(map[types.UID]*Pod), removed: make(map[string]*Tombstone),
		changed: make(chan struct{}), watches: make(map[*Watcher]struct{}), onIdentity: o.OnIdentityWanted}
}

// tellIdentity tells onIdentity the identity wish as it stands, if it
// changed since the last call. It is called without the journal's lock,
// after each change of the count, and never waits: one caller at a time
// tells (the teller), reading the count again after each call until what
// it told is current; a caller that finds a teller at work leaves the
// change to it. So calls never overlap, and the last one tells the
// current wish.
func (j *Journal) tellIdentity() {
	if j.onIdentity == nil {
		return
	}
	j.mu.Lock()
	if j.telling {
		j.mu.Unlock()
		return
	}
	j.telling = true
	for {
		wanted := j.identities > 0
		if wanted == j.told {
			j.telling = false
			j.mu.Unlock()
			return
		}
		j.told = wanted
		j.mu.Unlock()
		j.onIdentity(wanted)
		j.mu.Lock()
	}
}

// Epoch returns the journal's epoch: cursors of another epoch cannot be
// resumed from.
func (j *Journal) Epoch() string { return j.epoch }

// Kind says what an entry is about.
type Kind uint8

const (
	// KindPod: a pod changed (Entry.Pod, Transitions, Source).
	KindPod Kind = iota + 1
	// KindRuntime: the runtime's status changed (Entry.Runtime).
	KindRuntime
)

// Source says what found a pod's change.
type Source uint8

const (
	SourceRelist Source = iota + 1 // the periodic relist of every pod
	SourceHint                     // a single-pod relist a hint triggered
)

// Entry is one change. Entries and what they point to are never modified
// once appended.
type Entry struct {
	Seq  uint64
	Time time.Time
	Kind Kind
	// Pod is the pod's state after the change (Gone: the last state of a
	// pod the runtime no longer has).
	Pod         *Pod
	Transitions []Transition
	Source      Source
	Runtime     *RuntimeStatus

	size int // entrySize, set by Append
}

// Transition is one lifecycle event of a pod: the kubelet's types
// (ContainerStarted, ContainerDied, ContainerRemoved, PodSync) and
// PodUpdated (optional fields filled in).
type Transition struct {
	Type          string
	ContainerID   string
	ContainerName string
	Sandbox       bool
	ExitCode      *int32
}

// Transition types that are not the kubelet's.
const (
	PodUpdated = "PodUpdated"
)

// RuntimeState is the runtime's reachability or event stream state.
type RuntimeState uint8

const (
	RuntimeReachable RuntimeState = iota + 1
	RuntimeUnreachable
	RuntimeEventStreamLost
	RuntimeEventStreamConnected
)

// RuntimeStatus is a change of the runtime's status.
type RuntimeStatus struct {
	State   RuntimeState
	Message string
}

// Pod is one pod's state: its listing and its last status.
//
// A pod state, its sandboxes and containers are immutable once appended,
// and shared: Append gives a pod's new state the previous state's
// *Sandbox and *Container wherever they are equal, so that an entry for a
// change of one container holds that container and a slice of pointers,
// not a copy of the whole pod.
type Pod struct {
	UID         types.UID
	Name        string
	Namespace   string
	IPs         []string
	Labels      cruntime.Labels
	Annotations cruntime.Labels
	Sandboxes   []*Sandbox
	Containers  []*Container
	Gone        bool
	ObservedAt  time.Time
}

// Sandbox is one pod sandbox.
type Sandbox struct {
	ID          string
	Name        string // as listed: the pod's name
	State       cruntime.State
	Attempt     uint32
	CreatedAt   time.Time
	IPs         []string
	HostNetwork bool
	Labels      cruntime.Labels
	Annotations cruntime.Labels
}

// Container is one container: as listed, and its status as pleg last
// inspected it.
//
// The status is shared with pleg's status cache, not copied (one status a
// container for both: docs/performance.md), and read only through the
// methods below, which return values: nothing written through a Container
// reaches the cache. WithStatus gives a container its status.
type Container struct {
	ID   string
	Name string
	// State is the listing's.
	State   cruntime.State
	Attempt uint32
	// Image is the status's, or the listing's when the status has none.
	Image string
	// ListCreatedAt is the creation time the runtime's listing gives
	// (nanoseconds), which may differ from its status's CreatedAt: CRI-O
	// lists the time it began creating the container and reports, in the
	// status, the time the container was created, tens of milliseconds
	// later.
	ListCreatedAt int64
	Identity      *Identity

	status *cruntime.ContainerStatus // shared, read-only; nil: none
}

// WithStatus returns c reading status st (nil: none), which it shares:
// st is never changed afterwards (cruntime.Runtime's contract: statuses
// are read-only values).
func (c Container) WithStatus(st *cruntime.ContainerStatus) Container {
	c.status = st
	return c
}

// Shares reports whether c reads status st itself, not a copy of it.
func (c *Container) Shares(st *cruntime.ContainerStatus) bool { return c.status == st }

// ExitCode is the status's exit code, once the status says the container
// exited (ok false before, or without a status).
func (c *Container) ExitCode() (code int32, ok bool) {
	if c.status == nil || c.status.State != cruntime.StateExited {
		return 0, false
	}
	return c.status.ExitCode, true
}

// The status's fields; zero without a status.

func (c *Container) ImageRef() string {
	if c.status == nil {
		return ""
	}
	return c.status.ImageRef
}

func (c *Container) CreatedAt() time.Time {
	if c.status == nil {
		return time.Time{}
	}
	return c.status.CreatedAt
}

func (c *Container) StartedAt() time.Time {
	if c.status == nil {
		return time.Time{}
	}
	return c.status.StartedAt
}

func (c *Container) FinishedAt() time.Time {
	if c.status == nil {
		return time.Time{}
	}
	return c.status.FinishedAt
}

func (c *Container) Reason() string {
	if c.status == nil {
		return ""
	}
	return c.status.Reason
}

func (c *Container) Message() string {
	if c.status == nil {
		return ""
	}
	return c.status.Message
}

// Labels are the container's (immutable values).
func (c *Container) Labels() cruntime.Labels {
	if c.status == nil {
		return cruntime.Labels{}
	}
	return c.status.Labels
}

func (c *Container) Annotations() cruntime.Labels {
	if c.status == nil {
		return cruntime.Labels{}
	}
	return c.status.Annotations
}

// Identity ties a container to what the kernel sees.
type Identity struct {
	PID        int64
	CgroupPath string
}

// Tombstone is a removed container or sandbox, kept for lookups.
type Tombstone struct {
	Pod       *Pod
	RemovedAt time.Time

	size int // what it is charged in Journal.dead
}

// Append adds e and wakes the watchers; it returns e's sequence number.
// It never blocks on a watcher. e's Seq is given; its Time is the clock's
// when zero, and never earlier than the last entry's (a time before it is
// raised to it): entry times never run backwards against sequence
// numbers, as the expiry of the oldest first requires. A pod entry's
// sandboxes and containers equal to those of the pod's current state are
// replaced by them (Pod) in a copy of e.Pod: Append changes nothing it is
// given, and the journal holds e.Pod, its sandboxes and its containers
// from then on (they must not be changed).
func (j *Journal) Append(e Entry) uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	var prev *Pod
	if e.Kind == KindPod && e.Pod != nil {
		prev = j.pods[e.Pod.UID]
		e.Pod = share(e.Pod, prev)
	}
	e.size = entrySize(&e, prev)
	j.head++
	e.Seq = j.head
	if e.Time.IsZero() {
		e.Time = j.clock.Now()
	}
	if e.Time.Before(j.last) {
		e.Time = j.last
	}
	j.last = e.Time
	ep := &e
	if j.n == j.size {
		j.dropOldestLocked()
	}
	j.ring[(j.start+j.n)%j.size] = ep
	j.n++
	j.bytes += ep.size
	if e.Kind == KindPod && e.Pod != nil {
		j.track(ep)
	}
	j.expireLocked(e.Time)
	close(j.changed)
	j.changed = make(chan struct{})
	return e.Seq
}

// track updates the current pods and the tombstones with a pod entry.
func (j *Journal) track(e *Entry) {
	p := e.Pod
	prev := j.pods[p.UID]
	if p.Gone {
		delete(j.pods, p.UID)
	} else {
		j.pods[p.UID] = p
	}
	// Every container or sandbox of the previous state that the new one
	// lacks is removed.
	if prev == nil {
		return
	}
	keep := map[string]bool{}
	if !p.Gone {
		for _, c := range p.Containers {
			keep[c.ID] = true
		}
		for _, s := range p.Sandboxes {
			keep[s.ID] = true
		}
	}
	// The tombstones of one removal share prev: the first is charged
	// its size.
	podBytes := -1
	bury := func(id string) {
		if keep[id] {
			return
		}
		size := tombstoneSize + len(id)
		if podBytes < 0 {
			podBytes = podSize(prev)
			size += podBytes
		}
		if old, ok := j.removed[id]; ok {
			j.dead -= old.size
		} else {
			j.gone = append(j.gone, id)
		}
		j.removed[id] = &Tombstone{Pod: prev, RemovedAt: e.Time, size: size}
		j.dead += size
	}
	for _, c := range prev.Containers {
		bury(c.ID)
	}
	for _, s := range prev.Sandboxes {
		bury(s.ID)
	}
}

// expireLocked drops the entries and tombstones older than the maximum
// age, and the oldest of each beyond the maximum bytes.
func (j *Journal) expireLocked(now time.Time) {
	cutoff := now.Add(-j.maxAge)
	for j.n > 1 && (j.ring[j.start].Time.Before(cutoff) || j.bytes > j.maxBytes) {
		j.dropOldestLocked()
	}
	drop := 0
	for drop < len(j.gone) {
		t := j.removed[j.gone[drop]]
		if t != nil && !t.RemovedAt.Before(cutoff) && j.dead <= j.maxBytes {
			break
		}
		if t != nil {
			j.dead -= t.size
		}
		delete(j.removed, j.gone[drop])
		drop++
	}
	if drop > 0 {
		j.gone = slices.Delete(j.gone, 0, drop)
	}
}

// dropOldestLocked forgets the oldest retained entry.
func (j *Journal) dropOldestLocked() {
	j.bytes -= j.ring[j.start].size
	j.ring[j.start] = nil
	j.start = (j.start + 1) % j.size
	j.n--
}

// entrySize estimates the memory an entry holds: its structs, slices and
// strings, and its pod's, without the sandboxes and containers it shares
// with prev, the pod's state before it (nil: none); the labels and
// annotations it counts are shared with the pod's status while the pod
// lives, so it is an upper bound.
func entrySize(e *Entry, prev *Pod) int {
	n := 96 + len(e.Transitions)*64
	for _, t := range e.Transitions {
		n += len(t.ContainerID) + len(t.ContainerName)
	}
	if e.Pod != nil {
		n += podSizeBeside(e.Pod, prev)
	}
	return n
}

// share returns p with its sandboxes and containers equal to those of
// prev (same ID, equal content) replaced by prev's: p itself when there
// are none, a copy of p otherwise (p is not changed). In a copy, the
// others get an allocation each: the caller may have put them in one
// array (as journalPod does), which the entry would otherwise keep whole
// for them.
func share(p, prev *Pod) *Pod {
	if prev == nil || p == prev {
		return p
	}
	var sbs []*Sandbox // nil until one is shared
	for i, s := range p.Sandboxes {
		for _, o := range prev.Sandboxes {
			if o.ID == s.ID && o != s && sandboxEqual(o, s) {
				if sbs == nil {
					sbs = slices.Clone(p.Sandboxes)
				}
				sbs[i] = o
				break
			}
		}
	}
	var cts []*Container
	for i, c := range p.Containers {
		for _, o := range prev.Containers {
			if o.ID == c.ID && o != c && containerEqual(o, c) {
				if cts == nil {
					cts = slices.Clone(p.Containers)
				}
				cts[i] = o
				break
			}
		}
	}
	if sbs == nil && cts == nil {
		return p
	}
	if sbs == nil {
		sbs = slices.Clone(p.Sandboxes)
	}
	if cts == nil {
		cts = slices.Clone(p.Containers)
	}
	for i, s := range sbs {
		if !slicesContains(prev.Sandboxes, s) {
			own := *s
			sbs[i] = &own
		}
	}
	for i, c := range cts {
		if !slicesContains(prev.Containers, c) {
			own := *c
			cts[i] = &own
		}
	}
	q := *p
	q.Sandboxes, q.Containers = sbs, cts
	return &q
}

func slicesContains[T any](s []*T, x *T) bool {
	for _, o := range s {
		if o == x {
			return true
		}
	}
	return false
}

func sandboxEqual(a, b *Sandbox) bool {
	return a.ID == b.ID && a.Name == b.Name && a.State == b.State && a.Attempt == b.Attempt && a.CreatedAt.Equal(b.CreatedAt) &&
		slices.Equal(a.IPs, b.IPs) && a.HostNetwork == b.HostNetwork && a.Labels.Equal(b.Labels) && a.Annotations.Equal(b.Annotations)
}

func containerEqual(a, b *Container) bool {
	return a.ID == b.ID && a.Name == b.Name && a.State == b.State && a.Attempt == b.Attempt && a.Image == b.Image &&
		a.ListCreatedAt == b.ListCreatedAt &&
		(a.Identity == nil) == (b.Identity == nil) && (a.Identity == nil || *a.Identity == *b.Identity) &&
		(a.status == b.status || statusEqual(a, b))
}

// statusEqual compares what a and b read of their statuses.
func statusEqual(a, b *Container) bool {
	ac, aok := a.ExitCode()
	bc, bok := b.ExitCode()
	return ac == bc && aok == bok && a.ImageRef() == b.ImageRef() && a.CreatedAt().Equal(b.CreatedAt()) &&
		a.StartedAt().Equal(b.StartedAt()) && a.FinishedAt().Equal(b.FinishedAt()) && a.Reason() == b.Reason() &&
		a.Message() == b.Message() && a.Labels().Equal(b.Labels()) && a.Annotations().Equal(b.Annotations())
}

// The structs' sizes, as entrySize charges them.
const (
	podStructSize       = int(unsafe.Sizeof(Pod{}))
	sandboxStructSize   = int(unsafe.Sizeof(Sandbox{}))
	containerStructSize = int(unsafe.Sizeof(Container{}))
	statusStructSize    = int(unsafe.Sizeof(cruntime.ContainerStatus{}))
)

// tombstoneSize estimates a tombstone's struct, its map entry and its
// place in the removal order, without its ID and pod.
const tombstoneSize = 112

// podSize estimates the memory a pod state holds.
func podSize(p *Pod) int { return podSizeBeside(p, nil) }

// podSizeBeside estimates the memory a pod state holds beside prev, whose
// sandboxes, containers, labels and annotations it may share (nil: none).
func podSizeBeside(p, prev *Pod) int {
	n := podStructSize + len(p.Name) + len(p.Namespace) + len(p.UID) + 8*(len(p.Sandboxes)+len(p.Containers))
	if prev == nil || !p.Labels.SameAs(prev.Labels) {
		n += p.Labels.Bytes()
	}
	if prev == nil || !p.Annotations.SameAs(prev.Annotations) {
		n += p.Annotations.Bytes()
	}
	for _, ip := range p.IPs {
		n += 16 + len(ip)
	}
	for _, s := range p.Sandboxes {
		if prev == nil || !slicesContains(prev.Sandboxes, s) {
			n += sandboxStructSize + len(s.ID) + s.Labels.Bytes() + s.Annotations.Bytes()
		}
	}
	for _, c := range p.Containers {
		if prev == nil || !slicesContains(prev.Containers, c) {
			n += containerStructSize + len(c.ID) + len(c.Name) + len(c.Image)
			// The status is shared with the status cache while the pod
			// lives; the journal may be its last holder after.
			if st := c.status; st != nil {
				n += statusStructSize + len(st.ImageRef) + len(st.Reason) + len(st.Message) + st.Labels.Bytes() + st.Annotations.Bytes()
			}
		}
	}
	return n
}

// oldestLocked returns the sequence number of the oldest retained entry
// (head+1 when none is retained).
func (j *Journal) oldestLocked() uint64 {
	if j.n == 0 {
		return j.head + 1
	}
	return j.ring[j.start].Seq
}

// entryLocked returns the retained entry seq (nil: not retained).
func (j *Journal) entryLocked(seq uint64) *Entry {
	oldest := j.oldestLocked()
	if seq < oldest || seq > j.head {
		return nil
	}
	return j.ring[(j.start+int(seq-oldest))%j.size]
}

// Cursor is a position in a journal: after Seq, in Epoch.
type Cursor struct {
	Epoch string
	Seq   uint64
}

// String is the cursor's opaque form, as clients see it.
func (c Cursor) String() string { return c.Epoch + "-" + strconv.FormatUint(c.Seq, 10) }

// ErrInvalidCursor is returned for a cursor that is not one.
var ErrInvalidCursor = errors.New("invalid cursor")

// ParseCursor parses the opaque form of a cursor.
func ParseCursor(s string) (Cursor, error) {
	i := strings.LastIndexByte(s, '-')
	if i <= 0 {
		return Cursor{}, fmt.Errorf("%w %s: want EPOCH-SEQUENCE, as a message of a watch carried it", ErrInvalidCursor, textfmt.Echo(s))
	}
	seq, err := strconv.ParseUint(s[i+1:], 10, 64)
	if err != nil {
		return Cursor{}, fmt.Errorf("%w %s: bad sequence number", ErrInvalidCursor, textfmt.Echo(s))
	}
	return Cursor{Epoch: s[:i], Seq: seq}, nil
}

// Head returns the cursor of the last entry.
func (j *Journal) Head() Cursor {
	j.mu.Lock()
	defer j.mu.Unlock()
	return Cursor{Epoch: j.epoch, Seq: j.head}
}

// Pods returns the current pods that f selects (nil: all), sorted by
// namespace, name and UID, and the cursor they are current at.
func (j *Journal) Pods(f *Filter) ([]*Pod, Cursor) {
	j.mu.Lock()
	pods := make([]*Pod, 0, len(j.pods))
	for _, p := range j.pods {
		if f.matchPod(p) {
			pods = append(pods, p)
		}
	}
	c := Cursor{Epoch: j.epoch, Seq: j.head}
	j.mu.Unlock()
	sortPods(pods)
	return pods, c
}

// Pod returns the current state of pod uid.
func (j *Journal) Pod(uid types.UID) (*Pod, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	p, ok := j.pods[uid]
	return p, ok
}

// Found is a container or sandbox looked up by ID.
type Found struct {
	Pod       *Pod
	Container *Container // set for a container
	Sandbox   *Sandbox   // set for a sandbox
	Removed   bool
	RemovedAt time.Time
}

// Container finds a container or sandbox by ID among the current pods and
// those removed within the retention.
func (j *Journal) Container(id string) (Found, bool) {
	// Under the lock, only the pods are taken (they are immutable): the
	// scan of their containers runs without it, so Append and the
	// watchers do not wait for it.
	j.mu.Lock()
	pods := make([]*Pod, 0, len(j.pods))
	for _, p := range j.pods {
		pods = append(pods, p)
	}
	t := j.removed[id]
	j.mu.Unlock()
	for _, p := range pods {
		if f, ok := find(p, id); ok {
			return f, true
		}
	}
	if t != nil {
		if f, ok := find(t.Pod, id); ok {
			f.Removed, f.RemovedAt = true, t.RemovedAt
			return f, true
		}
	}
	return Found{}, false
}

func find(p *Pod, id string) (Found, bool) {
	for _, c := range p.Containers {
		if c.ID == id {
			return Found{Pod: p, Container: c}, true
		}
	}
	for _, s := range p.Sandboxes {
		if s.ID == id {
			return Found{Pod: p, Sandbox: s}, true
		}
	}
	return Found{}, false
}

func sortPods(pods []*Pod) {
	slices.SortFunc(pods, func(a, b *Pod) int {
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return strings.Compare(string(a.UID), string(b.UID))
	})
}
