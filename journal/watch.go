package journal

import (
	"context"
	"errors"
	"time"
)

// MessageType says what a watcher's message is.
type MessageType uint8

const (
	// Snapshot: one current pod (Message.Pod), before SnapshotEnd.
	Snapshot MessageType = iota + 1
	// SnapshotEnd: the snapshot is complete.
	SnapshotEnd
	// Event: a pod changed (Pod, Transitions, Source).
	Event
	// Bookmark: nothing for this watcher happened; its cursor moves on.
	Bookmark
	// Runtime: the runtime's status changed (Runtime).
	Runtime
	// ResyncRequired: the cursor cannot be resumed from (Reason); the
	// watch ends. Watch again without a cursor.
	ResyncRequired
)

func (t MessageType) String() string {
	switch t {
	case Snapshot:
		return "snapshot"
	case SnapshotEnd:
		return "snapshot-end"
	case Event:
		return "event"
	case Bookmark:
		return "bookmark"
	case Runtime:
		return "runtime-status"
	case ResyncRequired:
		return "resync-required"
	}
	return "unknown"
}

// Message is what a watcher receives. Every message carries the cursor to
// resume after it.
type Message struct {
	Type        MessageType
	Cursor      Cursor
	Time        time.Time
	Pod         *Pod
	Transitions []Transition
	Source      Source
	Runtime     *RuntimeStatus
	Reason      string
}

// Watcher reads a journal from a position. It is used by one goroutine.
type Watcher struct {
	j      *Journal
	filter *Filter
	// snapshot: the pods still to send before SnapshotEnd (snapshotting
	// until it is sent).
	snapshot     []*Pod
	snapshotting bool
	pos          uint64 // the last sequence number read (sent or skipped)
	resync       string // the reason of a pending ResyncRequired
	done         bool
}

// Resync reasons.
const (
	ReasonOtherEpoch  = "the cursor is from another pleg instance (it restarted): its events are not kept"
	ReasonTooOld      = "the cursor is older than the journal's retention"
	ReasonFellBehind  = "the watcher fell behind the journal's retention"
	ReasonFutureEvent = "the cursor is ahead of the journal"
)

// ErrClosed is returned by Next after Close.
var ErrClosed = errors.New("journal: watcher closed")

// ErrEnded is returned by Next after a ResyncRequired message.
var ErrEnded = errors.New("journal: watch ended; watch again without a cursor")

// Watch returns a watcher from cursor (its opaque form; empty: a snapshot
// first) through filter f (nil: everything). An invalid cursor is an
// error (ErrInvalidCursor); one that cannot be resumed from gives a
// watcher whose first message is ResyncRequired.
func (j *Journal) Watch(cursor string, f *Filter) (*Watcher, error) {
	w := &Watcher{j: j, filter: f}
	var c Cursor
	if cursor != "" {
		var err error
		if c, err = ParseCursor(cursor); err != nil {
			return nil, err
		}
	}
	if cursor == "" {
		// The snapshot is taken under the lock and sorted without it
		// (pods are immutable); the watcher reads on from the head it
		// was taken at.
		j.mu.Lock()
		for _, p := range j.pods {
			if f.matchPod(p) {
				w.snapshot = append(w.snapshot, p)
			}
		}
		w.pos = j.head
		j.mu.Unlock()
		sortPods(w.snapshot)
		w.snapshotting = true
	}
	j.mu.Lock()
	first := false
	defer func() {
		j.mu.Unlock()
		if first {
			j.tellIdentity()
		}
	}()
	switch {
	case cursor == "":
	case c.Epoch != j.epoch:
		w.resync, w.pos = ReasonOtherEpoch, j.head
	case c.Seq > j.head:
		w.resync, w.pos = ReasonFutureEvent, j.head
	case c.Seq+1 < j.oldestLocked():
		w.resync, w.pos = ReasonTooOld, c.Seq
	default:
		w.pos = c.Seq
	}
	j.watches[w] = struct{}{}
	if f != nil && f.identity {
		j.identities++
		first = j.identities == 1
	}
	return w, nil
}

// IdentityWanted reports whether an open watcher asked for containers'
// identities (FilterSpec.Identity): while none does, the generator need
// not fetch them.
func (j *Journal) IdentityWanted() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.identities > 0
}

// Next returns the next message, waiting for one at most until ctx ends.
// When the watcher has nothing to send for the bookmark interval, it
// returns a Bookmark.
func (w *Watcher) Next(ctx context.Context) (Message, error) {
	j := w.j
	var timer <-chan time.Time
	for {
		j.mu.Lock()
		m, ok, changed, err := w.nextLocked()
		j.mu.Unlock()
		if ok || err != nil {
			return m, err
		}
		if changed == nil {
			continue // more entries to skip: the lock was let go in between
		}
		if timer == nil {
			t := j.clock.NewTimer(j.bookmark)
			defer t.Stop()
			timer = t.C()
		}
		select {
		case <-ctx.Done():
			return Message{}, ctx.Err()
		case <-changed:
		case <-timer:
			j.mu.Lock()
			m, ok, _, err := w.nextLocked()
			if !ok && err == nil {
				// Nothing selected up to w.pos (the head, or as far as
				// one batch got): the cursor moves on.
				m = Message{Type: Bookmark, Cursor: Cursor{Epoch: j.epoch, Seq: w.pos}, Time: j.clock.Now()}
				ok = true
			}
			j.mu.Unlock()
			return m, err
		}
	}
}

// scanBatch is how many entries a watcher skips (those its filter does not
// select) under the journal's lock at once: a filtered watcher far behind
// would otherwise hold the lock, and Append, for a scan of the whole
// retention (about 190 us for DefaultSize entries with a label selector).
const scanBatch = 256

// nextLocked returns the next message if there is one, or the channel to
// wait on, or neither (changed nil) when it skipped scanBatch entries and
// more wait: call it again.
func (w *Watcher) nextLocked() (m Message, ok bool, changed <-chan struct{}, err error) {
	j := w.j
	switch {
	case w.done:
		if _, open := j.watches[w]; !open {
			return m, false, nil, ErrClosed
		}
		return m, false, nil, ErrEnded
	case w.resync != "":
		w.done = true
		return Message{Type: ResyncRequired, Cursor: Cursor{Epoch: j.epoch, Seq: j.head}, Time: j.clock.Now(), Reason: w.resync}, true, nil, nil
	case w.snapshotting && len(w.snapshot) > 0:
		p := w.snapshot[0]
		w.snapshot[0] = nil
		w.snapshot = w.snapshot[1:]
		return Message{Type: Snapshot, Cursor: Cursor{Epoch: j.epoch, Seq: w.pos}, Time: p.ObservedAt, Pod: p}, true, nil, nil
	case w.snapshotting:
		w.snapshotting, w.snapshot = false, nil
		return Message{Type: SnapshotEnd, Cursor: Cursor{Epoch: j.epoch, Seq: w.pos}, Time: j.clock.Now()}, true, nil, nil
	}
	if w.pos+1 < j.oldestLocked() {
		w.done = true
		return Message{Type: ResyncRequired, Cursor: Cursor{Epoch: j.epoch, Seq: j.head}, Time: j.clock.Now(), Reason: ReasonFellBehind}, true, nil, nil
	}
	for n := 0; w.pos < j.head; n++ {
		if n == scanBatch {
			return m, false, nil, nil
		}
		w.pos++
		e := j.entryLocked(w.pos)
		if e == nil || !w.filter.matchEntry(e) {
			continue
		}
		m := Message{Cursor: Cursor{Epoch: j.epoch, Seq: e.Seq}, Time: e.Time}
		switch e.Kind {
		case KindRuntime:
			m.Type, m.Runtime = Runtime, e.Runtime
		default:
			m.Type, m.Pod, m.Transitions, m.Source = Event, e.Pod, e.Transitions, e.Source
		}
		return m, true, nil, nil
	}
	return m, false, j.changed, nil
}

// Position returns the sequence number of the last entry the watcher read
// (sent or skipped): where it starts, before its first message (the head
// for a snapshot or a cursor of another journal, the cursor's otherwise).
func (w *Watcher) Position() uint64 {
	w.j.mu.Lock()
	defer w.j.mu.Unlock()
	return w.pos
}

// Close ends the watcher; Next then returns ErrClosed.
func (w *Watcher) Close() {
	j := w.j
	j.mu.Lock()
	last := false
	if _, open := j.watches[w]; open && w.filter != nil && w.filter.identity {
		j.identities--
		last = j.identities == 0
	}
	delete(j.watches, w)
	w.done = true
	w.snapshot = nil
	j.mu.Unlock()
	if last {
		j.tellIdentity()
	}
}
