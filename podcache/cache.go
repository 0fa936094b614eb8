// Package podcache is the pod status cache the generator keeps fresh: the
// last status fetched for every pod, when it was fetched, and a global
// timestamp saying "everything here is at least this fresh".
//
// Readers that need a status newer than some instant (a pod worker that
// just acted on a pod) call GetNewerThan, which blocks until the generator
// has observed the pod after that instant, or until the context ends.
//
//	c := podcache.New()
//	c.Set(uid, status, nil, t0)
//	c.UpdateTime(t0)
//	st, err := c.GetNewerThan(ctx, uid, t0.Add(-time.Second)) // returns at once
package podcache

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"k8s.io/apimachinery/pkg/types"
)

// Entry is one cached pod: its status, the error of the inspection that
// produced it, and when it was observed.
type Entry struct {
	Status   *cruntime.PodStatus
	Err      error
	Modified time.Time
}

// Cache stores pod statuses. It is safe for concurrent use.
type Cache struct {
	mu        sync.Mutex
	pods      map[types.UID]*Entry
	timestamp time.Time // global: every entry is at least this fresh
	// held: pods the global timestamp does not cover, with the timestamp
	// that does (UpdateTime's held pods, until their next write).
	held    map[types.UID]time.Time
	waiters map[types.UID][]*waiter
	onWait  func()
}

type waiter struct {
	min time.Time
	ch  chan Entry // capacity 1
}

// New returns an empty cache.
func New() *Cache {
	return &Cache{
		pods:    make(map[types.UID]*Entry),
		held:    make(map[types.UID]time.Time),
		waiters: make(map[types.UID][]*waiter),
	}
}

// Get returns the cached status of uid and the error stored with it. A
// missing entry yields an empty status carrying only the UID, and no error.
func (c *Cache) Get(uid types.UID) (*cruntime.PodStatus, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entryLocked(uid)
	return e.Status, e.Err
}

// Entry returns the cached entry of uid and whether it exists.
func (c *Cache) Entry(uid types.UID) (Entry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.pods[uid]
	if !ok {
		return Entry{Status: &cruntime.PodStatus{UID: uid}}, false
	}
	return *e, true
}

// List returns every cached entry, sorted by namespace, name and UID.
func (c *Cache) List() []Entry {
	c.mu.Lock()
	out := make([]Entry, 0, len(c.pods))
	for _, e := range c.pods {
		out = append(out, *e)
	}
	c.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].Status, out[j].Status
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		return a.UID < b.UID
	})
	return out
}

// Len returns the number of cached pods.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pods)
}

// Timestamp returns the global timestamp set by UpdateTime.
func (c *Cache) Timestamp() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.timestamp
}

// Set stores the status of uid (and the error of the inspection, which may
// be nil) as observed at t, and wakes the waiters of uid whose minimum time
// is not after t.
func (c *Cache) Set(uid types.UID, status *cruntime.PodStatus, err error, t time.Time) {
	if status == nil {
		status = &cruntime.PodStatus{UID: uid}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pods[uid] = &Entry{Status: status, Err: err, Modified: t}
	c.releaseLocked(uid)
	c.notifyLocked(uid, c.freshLocked(uid, t))
}

// MarkObserved records that uid was observed at t without any change: the
// entry's time moves to t (if it exists) and waiters up to t are woken.
func (c *Cache) MarkObserved(uid types.UID, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.pods[uid]; ok && t.After(e.Modified) {
		e2 := *e
		e2.Modified = t
		c.pods[uid] = &e2
	}
	c.releaseLocked(uid)
	c.notifyLocked(uid, c.freshLocked(uid, t))
}

// Delete removes the entry of uid. A held pod's waiters are woken with the
// empty status, as the global timestamp now covers it.
func (c *Cache) Delete(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pods, uid)
	if c.releaseLocked(uid) {
		c.notifyLocked(uid, c.timestamp)
	}
}

// UpdateTime sets the global timestamp to t and wakes every waiter whose
// minimum time is not after t, with the current entry of its pod (or the
// empty status).
//
// The pods in held are not covered by it: their entries are still being
// refreshed (pleg's global relist hands a pod whose single-pod relist is
// under way over to it). Until their next Set, MarkObserved or Delete they
// keep the global timestamp they had, and their waiters keep waiting.
func (c *Cache) UpdateTime(t time.Time, held ...types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, uid := range held {
		if _, ok := c.held[uid]; !ok {
			c.held[uid] = c.timestamp
		}
	}
	c.timestamp = t
	for uid := range c.waiters {
		c.notifyLocked(uid, c.freshLocked(uid, t))
	}
}

// freshLocked returns how fresh uid's information is known to be, given an
// entry written or observed at t: the later of t and the global timestamp
// that covers uid.
func (c *Cache) freshLocked(uid types.UID, t time.Time) time.Time {
	g, ok := c.held[uid]
	if !ok {
		g = c.timestamp
	}
	if g.After(t) {
		return g
	}
	return t
}

// releaseLocked ends the hold of uid, reporting whether it had one.
func (c *Cache) releaseLocked(uid types.UID) bool {
	if _, ok := c.held[uid]; !ok {
		return false
	}
	delete(c.held, uid)
	return true
}

// GetNewerThan returns the status of uid once the cache holds information
// about it that is strictly newer than min: the entry was modified after
// min, or the global timestamp is after min. It blocks until then, or until
// ctx ends (returning ctx.Err()).
func (c *Cache) GetNewerThan(ctx context.Context, uid types.UID, min time.Time) (*cruntime.PodStatus, error) {
	c.mu.Lock()
	e := c.entryLocked(uid)
	if c.freshLocked(uid, e.Modified).After(min) {
		c.mu.Unlock()
		return e.Status, e.Err
	}
	w := &waiter{min: min, ch: make(chan Entry, 1)}
	c.waiters[uid] = append(c.waiters[uid], w)
	onWait := c.onWait
	c.mu.Unlock()
	if onWait != nil {
		onWait()
	}

	select {
	case e := <-w.ch:
		return e.Status, e.Err
	case <-ctx.Done():
		c.mu.Lock()
		c.removeWaiterLocked(uid, w)
		c.mu.Unlock()
		// A wake-up may have raced with the cancellation: prefer the data.
		select {
		case e := <-w.ch:
			return e.Status, e.Err
		default:
		}
		return nil, ctx.Err()
	}
}

func (c *Cache) entryLocked(uid types.UID) Entry {
	if e, ok := c.pods[uid]; ok {
		return *e
	}
	return Entry{Status: &cruntime.PodStatus{UID: uid}}
}

// notifyLocked wakes the waiters of uid whose minimum time is not after t.
func (c *Cache) notifyLocked(uid types.UID, t time.Time) {
	ws := c.waiters[uid]
	if len(ws) == 0 {
		return
	}
	e := c.entryLocked(uid)
	keep := ws[:0]
	for _, w := range ws {
		if w.min.After(t) {
			keep = append(keep, w)
			continue
		}
		w.ch <- e
	}
	for i := len(keep); i < len(ws); i++ {
		ws[i] = nil
	}
	if len(keep) == 0 {
		delete(c.waiters, uid)
	} else {
		c.waiters[uid] = keep
	}
}

func (c *Cache) removeWaiterLocked(uid types.UID, w *waiter) {
	ws := c.waiters[uid]
	for i, x := range ws {
		if x == w {
			ws = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(c.waiters, uid)
	} else {
		c.waiters[uid] = ws
	}
}

// SetWaitHook sets f to be called, outside the cache's lock, each time a
// GetNewerThan call starts to wait; nil removes it. A generator whose
// adaptive relist moves the global timestamp only while someone waits
// sets it to be woken (pleg.Options.MaxRelistPeriod). f must not block.
func (c *Cache) SetWaitHook(f func()) {
	c.mu.Lock()
	c.onWait = f
	c.mu.Unlock()
}

// Waiters returns how many GetNewerThan calls are blocked.
func (c *Cache) Waiters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, ws := range c.waiters {
		n += len(ws)
	}
	return n
}
