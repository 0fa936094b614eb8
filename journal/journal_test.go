package journal

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"github.com/podlifecycle/pleg/cruntime"
	"k8s.io/apimachinery/pkg/types"
)

// pod builds a pod state: containers "id=state".
func pod(uid, ns string, lbl map[string]string, items ...string) *Pod {
	p := &Pod{UID: types.UID(uid), Name: "name-" + uid, Namespace: ns, Labels: cruntime.NewLabels(lbl)}
	for _, it := range items {
		id, st, _ := strings.Cut(it, "=")
		s := map[string]cruntime.State{"running": cruntime.StateRunning, "exited": cruntime.StateExited}[st]
		p.Containers = append(p.Containers, &Container{ID: id, State: s})
	}
	return p
}

func podEntry(p *Pod, types ...string) Entry {
	e := Entry{Kind: KindPod, Pod: p, Source: SourceRelist}
	for _, t := range types {
		e.Transitions = append(e.Transitions, Transition{Type: t})
	}
	return e
}

// collect reads what w has now: every message until it would wait.
func collect(t *testing.T, w *Watcher) []Message {
	t.Helper()
	var out []Message
	for {
		w.j.mu.Lock()
		m, ok, _, err := w.nextLocked()
		w.j.mu.Unlock()
		if err != nil {
			return out
		}
		if !ok {
			return out
		}
		out = append(out, m)
	}
}

// state replays messages into pod states by UID.
func state(msgs []Message) map[types.UID]*Pod {
	s := map[types.UID]*Pod{}
	for _, m := range msgs {
		if m.Type != Snapshot && m.Type != Event {
			continue
		}
		if m.Pod.Gone {
			delete(s, m.Pod.UID)
		} else {
			s[m.Pod.UID] = m.Pod
		}
	}
	return s
}

// A watch without a cursor is the snapshot, its end, then the changes,
// with no gap and no duplicate, wherever it starts among appends; a watch
// from any message's cursor gets exactly what followed that message.
func TestSnapshotThenEventsNoGapNoDuplicate(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	j := New(Options{Size: 1000})
	var watchers []*Watcher
	var seen [][]Message
	var heads []Cursor // the head when each watcher started
	for i := range 300 {
		uid := fmt.Sprintf("p%d", r.IntN(20))
		if r.IntN(5) == 0 {
			j.Append(podEntry(&Pod{UID: types.UID(uid), Name: uid, Namespace: "ns", Gone: true}, "ContainerRemoved"))
		} else {
			j.Append(podEntry(pod(uid, "ns", nil, fmt.Sprintf("c%d=running", i)), "ContainerStarted"))
		}
		if i%37 == 0 {
			w, err := j.Watch("", nil)
			if err != nil {
				t.Fatal(err)
			}
			watchers = append(watchers, w)
			seen = append(seen, nil)
			heads = append(heads, j.Head())
		}
		for k, w := range watchers {
			seen[k] = append(seen[k], collect(t, w)...)
		}
	}
	want, _ := j.Pods(nil)
	wantState := map[types.UID]*Pod{}
	for _, p := range want {
		wantState[p.UID] = p
	}
	for k, msgs := range seen {
		ends := 0
		last := uint64(0)
		for i, m := range msgs {
			if m.Type == SnapshotEnd {
				ends++
				// The snapshot is at the head it was taken at, and the
				// events after it come after its cursor.
				if m.Cursor != heads[k] {
					t.Fatalf("watcher %d: snapshot at %v, taken at %v", k, m.Cursor, heads[k])
				}
				last = m.Cursor.Seq
				if i > 0 && msgs[i-1].Type != Snapshot {
					t.Fatalf("watcher %d: snapshot end after %v", k, msgs[i-1].Type)
				}
			}
			if m.Type == Event {
				if m.Cursor.Seq <= last {
					t.Fatalf("watcher %d: event %d after %d: a duplicate or out of order", k, m.Cursor.Seq, last)
				}
				last = m.Cursor.Seq
			}
		}
		if ends != 1 {
			t.Fatalf("watcher %d: %d snapshot ends", k, ends)
		}
		if got := state(msgs); !reflect.DeepEqual(got, wantState) {
			t.Fatalf("watcher %d ends with %d pods, the journal has %d", k, len(got), len(wantState))
		}
		// Resuming from any message's cursor gets exactly what followed.
		for i := range msgs {
			if msgs[i].Type == Snapshot {
				continue
			}
			w, err := j.Watch(msgs[i].Cursor.String(), nil)
			if err != nil {
				t.Fatal(err)
			}
			var rest []Message
			for _, m := range msgs[i+1:] {
				if m.Type == Event {
					rest = append(rest, m)
				}
			}
			if got := collect(t, w); !reflect.DeepEqual(got, rest) {
				t.Fatalf("watcher %d: resuming after message %d got %d messages, want %d", k, i, len(got), len(rest))
			}
			w.Close()
		}
	}
}

// A cursor that cannot be resumed from gets an explicit ResyncRequired,
// never a silent gap: another instance's, one older than the retention,
// one ahead of the journal; a watcher that falls behind the retention
// too. A cursor that is not one is an error.
func TestResyncRequired(t *testing.T) {
	j := New(Options{Size: 5, Epoch: "e1"})
	for i := range 3 {
		j.Append(podEntry(pod("a", "ns", nil, fmt.Sprintf("c%d=running", i))))
	}
	old := j.Head()
	slow, _ := j.Watch(old.String(), nil)
	for i := range 10 {
		j.Append(podEntry(pod("b", "ns", nil, fmt.Sprintf("c%d=running", i))))
	}
	for _, c := range []struct {
		cursor, reason string
	}{
		{"e0-3", ReasonOtherEpoch},
		{old.String(), ReasonTooOld},
		{"e1-99", ReasonFutureEvent},
	} {
		w, err := j.Watch(c.cursor, nil)
		if err != nil {
			t.Fatal(err)
		}
		msgs := collect(t, w)
		if len(msgs) != 1 || msgs[0].Type != ResyncRequired || msgs[0].Reason != c.reason {
			t.Fatalf("cursor %s: %+v, want one ResyncRequired (%s)", c.cursor, msgs, c.reason)
		}
		if _, err := w.Next(context.Background()); !errors.Is(err, ErrEnded) {
			t.Fatalf("after ResyncRequired: %v", err)
		}
	}
	if msgs := collect(t, slow); len(msgs) != 1 || msgs[0].Reason != ReasonFellBehind {
		t.Fatalf("slow watcher: %+v", msgs)
	}
	for _, bad := range []string{"x", "e1-", "e1-x", "-5"} {
		if _, err := j.Watch(bad, nil); !errors.Is(err, ErrInvalidCursor) {
			t.Fatalf("cursor %q: %v", bad, err)
		}
	}
	// The oldest retained entry's predecessor still resumes; the one
	// before it would miss an entry.
	w, _ := j.Watch(fmt.Sprintf("e1-%d", j.Head().Seq-5), nil)
	if msgs := collect(t, w); len(msgs) != 5 || msgs[0].Type != Event {
		t.Fatalf("resume at the retention's edge: %d messages", len(msgs))
	}
	w, _ = j.Watch(fmt.Sprintf("e1-%d", j.Head().Seq-6), nil)
	if msgs := collect(t, w); len(msgs) != 1 || msgs[0].Type != ResyncRequired {
		t.Fatalf("resume past the retention's edge: %+v", msgs)
	}
}

// Filters apply to the snapshot and the events; runtime status always
// passes; an invalid filter names its bad part.
func TestFilters(t *testing.T) {
	j := New(Options{})
	web := map[string]string{"app": "web", "tier": "front"}
	db := map[string]string{"app": "db"}
	j.Append(podEntry(pod("a", "prod", web, "c1=running"), "ContainerStarted"))
	j.Append(podEntry(pod("b", "prod", db, "c2=running"), "ContainerStarted"))
	j.Append(podEntry(pod("c", "dev", web, "c3=running"), "ContainerStarted"))
	f, err := NewFilter(FilterSpec{Namespaces: []string{"prod"}, LabelSelector: "app in (web,cache)", EventTypes: []string{"ContainerDied"}})
	if err != nil {
		t.Fatal(err)
	}
	w, _ := j.Watch("", f)
	j.Append(podEntry(pod("a", "prod", web, "c1=exited"), "ContainerDied"))
	j.Append(podEntry(pod("a", "prod", web, "c1=exited", "c4=running"), "ContainerStarted"))
	j.Append(podEntry(pod("b", "prod", db, "c2=exited"), "ContainerDied"))
	j.Append(podEntry(pod("c", "dev", web, "c3=exited"), "ContainerDied"))
	j.Append(Entry{Kind: KindRuntime, Runtime: &RuntimeStatus{State: RuntimeUnreachable}})
	var got []string
	for _, m := range collect(t, w) {
		s := m.Type.String()
		if m.Pod != nil {
			s += " " + string(m.Pod.UID)
		}
		got = append(got, s)
	}
	want := []string{"snapshot a", "snapshot-end", "event a", "runtime-status"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for _, c := range []struct {
		spec  FilterSpec
		field string
	}{
		{FilterSpec{LabelSelector: "app in (web"}, "labelSelector"},
		{FilterSpec{Namespaces: []string{"Prod_1"}}, "namespaces"},
		{FilterSpec{EventTypes: []string{"ContainerExploded"}}, "eventTypes"},
		{FilterSpec{PodUIDs: []string{" "}}, "podUIDs"},
	} {
		_, err := NewFilter(c.spec)
		var fe *FilterError
		if !errors.As(err, &fe) || fe.Field != c.field || !strings.Contains(err.Error(), c.field) {
			t.Fatalf("%+v: %v, want an error naming %s", c.spec, err, c.field)
		}
	}
	// Identity updates go only to watchers that asked for identities.
	j.Append(podEntry(pod("a", "prod", web, "c1=exited"), PodUpdated))
	plain, _ := NewFilter(FilterSpec{})
	withID, _ := NewFilter(FilterSpec{Identity: true})
	for _, c := range []struct {
		f    *Filter
		want int
	}{{nil, 0}, {plain, 0}, {withID, 1}} {
		w, _ := j.Watch(fmt.Sprintf("%s-%d", j.Epoch(), j.Head().Seq-1), c.f)
		if got := len(collect(t, w)); got != c.want {
			t.Fatalf("identity update: %d messages, want %d", got, c.want)
		}
	}
}

// An idle watcher gets a bookmark each interval, whose cursor resumes
// past the events its filter skipped.
func TestBookmarks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := New(Options{BookmarkInterval: 10 * time.Second})
		f, _ := NewFilter(FilterSpec{Namespaces: []string{"watched"}})
		w, _ := j.Watch("", f)
		ctx := context.Background()
		if m, _ := w.Next(ctx); m.Type != SnapshotEnd {
			t.Fatalf("first message %v", m.Type)
		}
		got := make(chan Message, 1)
		go func() {
			m, _ := w.Next(ctx)
			got <- m
		}()
		for i := range 5 {
			time.Sleep(time.Second)
			j.Append(podEntry(pod(fmt.Sprint(i), "other", nil)))
		}
		synctest.Wait()
		if len(got) != 0 {
			t.Fatal("a message before the bookmark interval")
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		m := <-got
		if m.Type != Bookmark || m.Cursor != j.Head() {
			t.Fatalf("got %v at %v, want a bookmark at %v", m.Type, m.Cursor, j.Head())
		}
		w2, _ := j.Watch(m.Cursor.String(), f)
		if msgs := collect(t, w2); len(msgs) != 0 {
			t.Fatalf("resuming from the bookmark: %d messages", len(msgs))
		}
	})
}

// A removed container can still be looked up within the retention, with
// its pod's last state; then it is forgotten.
func TestRemovedContainerLookup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := New(Options{MaxAge: time.Minute})
		j.Append(podEntry(pod("a", "ns", nil, "c1=running", "c2=running")))
		j.Append(podEntry(pod("a", "ns", nil, "c2=running"), "ContainerDied", "ContainerRemoved"))
		f, ok := j.Container("c1")
		if !ok || !f.Removed || f.Container.ID != "c1" || f.Pod.UID != "a" {
			t.Fatalf("c1: %+v %v", f, ok)
		}
		if f, ok := j.Container("c2"); !ok || f.Removed {
			t.Fatalf("c2: %+v %v", f, ok)
		}
		time.Sleep(2 * time.Minute)
		j.Append(podEntry(pod("b", "ns", nil)))
		if _, ok := j.Container("c1"); ok {
			t.Fatal("c1 still found past the retention")
		}
		j.Append(podEntry(&Pod{UID: "a", Gone: true}, "ContainerRemoved"))
		if f, ok := j.Container("c2"); !ok || !f.Removed {
			t.Fatalf("c2 after its pod went: %+v %v", f, ok)
		}
		if _, ok := j.Pod("a"); ok {
			t.Fatal("a gone pod is current")
		}
	})
}

// Appending never waits for watchers, however many and however idle, and
// a watcher costs the journal its position only.
func BenchmarkAppend1000IdleWatchers(b *testing.B) {
	j := New(Options{})
	for range 1000 {
		if _, err := j.Watch("", nil); err != nil {
			b.Fatal(err)
		}
	}
	p := pod("a", "ns", nil, "c1=running")
	b.ReportAllocs()
	for b.Loop() {
		j.Append(podEntry(p, "ContainerStarted"))
	}
}

// IdentityWanted is true exactly while a watcher that asked for
// identities is open (closing twice counts once).
func TestIdentityWanted(t *testing.T) {
	j := New(Options{})
	plain, _ := NewFilter(FilterSpec{})
	withID, _ := NewFilter(FilterSpec{Identity: true})
	a, _ := j.Watch("", plain)
	if j.IdentityWanted() {
		t.Fatal("wanted with no identity watcher")
	}
	b, _ := j.Watch("", withID)
	c, _ := j.Watch(fmt.Sprintf("%s-0", j.Epoch()), withID)
	if !j.IdentityWanted() {
		t.Fatal("not wanted with two identity watchers")
	}
	b.Close()
	b.Close()
	if !j.IdentityWanted() {
		t.Fatal("not wanted with one identity watcher left")
	}
	c.Close()
	if j.IdentityWanted() {
		t.Fatal("still wanted after every identity watcher closed")
	}
	a.Close()
}

// A watcher's position before its first message: the head for a snapshot
// or a cursor it cannot resume from but an old one, the cursor otherwise.
func TestWatcherStartPosition(t *testing.T) {
	j := New(Options{Epoch: "e", Size: 4})
	for range 6 {
		j.Append(Entry{Kind: KindRuntime, Runtime: &RuntimeStatus{State: RuntimeReachable}})
	}
	for _, c := range []struct {
		cursor string
		want   uint64
	}{{"", 6}, {"e-4", 4}, {"e-1", 1}, {"other-3", 6}, {"e-9", 6}} {
		w, err := j.Watch(c.cursor, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := w.Position(); got != c.want {
			t.Errorf("Watch(%q).Position() = %d, want %d", c.cursor, got, c.want)
		}
		w.Close()
	}
}

// A filtered watcher skips, batch after batch, the many entries it does
// not select to reach the one it does.
func TestFilteredWatcherSkipsBatches(t *testing.T) {
	j := New(Options{Epoch: "e"})
	other := &Pod{UID: "o", Namespace: "a"}
	for range 3*scanBatch + 5 {
		j.Append(Entry{Kind: KindPod, Pod: other, Transitions: []Transition{{Type: "PodSync"}}})
	}
	mine := &Pod{UID: "m", Namespace: "b"}
	seq := j.Append(Entry{Kind: KindPod, Pod: mine, Transitions: []Transition{{Type: "PodSync"}}})
	f, err := NewFilter(FilterSpec{Namespaces: []string{"b"}})
	if err != nil {
		t.Fatal(err)
	}
	w, err := j.Watch("e-0", f)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	m, err := w.Next(context.Background())
	if err != nil || m.Type != Event || m.Pod != mine || m.Cursor.Seq != seq {
		t.Fatalf("Next = %+v, %v; want the event of pod m at %d", m, err, seq)
	}
}

// OnIdentityWanted's last call tells the current wish however Watch and
// Close race: here the call that tells "false" (the last identity watcher
// closed) is slow, and another identity watcher opens meanwhile. Told
// after the wish went back to true, a late false would stop identities
// while a watcher wants them.
func TestIdentityWantedLateFalse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var told []bool
		last := func() (bool, []bool) {
			mu.Lock()
			defer mu.Unlock()
			return len(told) > 0 && told[len(told)-1], slices.Clone(told)
		}
		release := make(chan struct{})
		j := New(Options{OnIdentityWanted: func(wanted bool) {
			mu.Lock()
			slow := !wanted && len(told) == 1
			mu.Unlock()
			if slow {
				<-release // the first false is slow to be told
			}
			mu.Lock()
			told = append(told, wanted)
			mu.Unlock()
		}})
		withID, _ := NewFilter(FilterSpec{Identity: true})
		a, _ := j.Watch("", withID)
		go a.Close() // tells false, slowly
		synctest.Wait()
		var b *Watcher
		go func() { b, _ = j.Watch("", withID) }() // the wish is true again
		synctest.Wait()
		close(release)
		synctest.Wait()
		if l, all := last(); !j.IdentityWanted() || !l {
			t.Fatalf("told %v while a watcher wants identities (IdentityWanted %v)", all, j.IdentityWanted())
		}
		b.Close()
		if l, all := last(); l {
			t.Fatalf("told %v after the last identity watcher closed", all)
		}
	})
}

// Removed containers are kept for lookups by age, not by count: many
// removals and entries after one (more than the journal's size) do not
// evict it within the maximum age. Their estimated bytes are bounded by
// MaxBytes: the oldest go first.
func TestRemovedContainersKeptByAge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := New(Options{Size: 40, MaxAge: 20 * time.Second})
		for i := range 100 { // 100 pods, each with one container, then removed
			uid := fmt.Sprintf("p%d", i)
			j.Append(podEntry(pod(uid, "ns", nil, "c-"+uid+"=running"), "ContainerStarted"))
			j.Append(podEntry(pod(uid, "ns", nil), "ContainerRemoved"))
			time.Sleep(30 * time.Millisecond)
		}
		for i := range 100 {
			if f, ok := j.Container(fmt.Sprintf("c-p%d", i)); !ok || !f.Removed {
				t.Fatalf("c-p%d, removed %v ago: %+v %v; want it found within the maximum age", i, time.Duration(100-i)*30*time.Millisecond, f, ok)
			}
		}
		time.Sleep(20 * time.Second)
		j.Append(podEntry(pod("b", "ns", nil)))
		if _, ok := j.Container("c-p99"); ok {
			t.Fatal("c-p99 still found past the maximum age")
		}
	})
	t.Run("bytes", func(t *testing.T) {
		j := New(Options{MaxBytes: 64 << 10, MaxAge: time.Hour})
		big := map[string]string{"note": strings.Repeat("x", 4000)}
		for i := range 40 { // each tombstone ~4.5 KB: about 14 fit
			uid := fmt.Sprintf("p%d", i)
			j.Append(podEntry(pod(uid, "ns", big, "c-"+uid+"=running"), "ContainerStarted"))
			j.Append(podEntry(pod(uid, "ns", big), "ContainerRemoved"))
		}
		if _, ok := j.Container("c-p0"); ok {
			t.Fatal("the oldest tombstone kept beyond MaxBytes")
		}
		if f, ok := j.Container("c-p39"); !ok || !f.Removed {
			t.Fatalf("the newest tombstone: %+v %v", f, ok)
		}
	})
}

// A pod's new state shares the containers and sandboxes it did not change
// with its last state, whatever the appender built; the changed ones are
// its own; the entry is charged for what it does not share; and the
// states read back are the states appended.
func TestEntriesShareUnchangedContainers(t *testing.T) {
	labels := map[string]string{"io.kubernetes.pod.uid": "a"}
	build := func(states ...string) *Pod {
		p := pod("a", "prod", labels, states...)
		p.Sandboxes = []*Sandbox{{ID: "sb", State: cruntime.StateRunning, Labels: cruntime.NewLabels(labels)}}
		for _, c := range p.Containers {
			*c = c.WithStatus(&cruntime.ContainerStatus{Labels: cruntime.LabelsOf("io.kubernetes.container.name", c.ID)}) // equal, not the same status
		}
		return p
	}
	j := New(Options{Epoch: "e"})
	first := build("c0=running", "c1=running", "c2=running", "c3=running")
	j.Append(podEntry(first, "ContainerStarted"))
	second := build("c0=running", "c1=exited", "c2=running", "c3=running")
	// Its containers in one array, as journalPod builds them.
	arr := make([]Container, len(second.Containers))
	for i, c := range second.Containers {
		arr[i] = *c
		second.Containers[i] = &arr[i]
	}
	j.Append(podEntry(second, "ContainerDied"))
	if second.Containers[1] != &arr[1] || second.Sandboxes[0] == first.Sandboxes[0] {
		t.Error("Append changed the pod it was given")
	}
	held, _ := j.Pod("a")
	if held.Containers[1] == &arr[1] {
		t.Error("the changed container left in the appender's array: the entry keeps the whole array")
	}
	for i, c := range held.Containers {
		if shared := c == first.Containers[i]; shared != (i != 1) {
			t.Errorf("container %s shared with the last state: %v", c.ID, shared)
		}
	}
	if held.Sandboxes[0] != first.Sandboxes[0] {
		t.Error("unchanged sandbox not shared")
	}
	if held.Containers[1].State != cruntime.StateExited || first.Containers[1].State != cruntime.StateRunning {
		t.Errorf("states mixed up: %v then %v", first.Containers[1].State, held.Containers[1].State)
	}
	j.mu.Lock()
	firstSize, secondSize := j.entryLocked(1).size, j.entryLocked(2).size
	j.mu.Unlock()
	if secondSize >= firstSize/2 {
		t.Errorf("an entry changing 1 of 4 containers charged %d bytes, the first state %d", secondSize, firstSize)
	}
	if p, _ := j.Pod("a"); !reflect.DeepEqual(p, build("c0=running", "c1=exited", "c2=running", "c3=running")) {
		t.Errorf("current state %+v", p)
	}
	w, err := j.Watch("e-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	msgs := collect(t, w)
	if len(msgs) != 1 || msgs[0].Pod.Containers[1].State != cruntime.StateExited || msgs[0].Pod.Containers[0].State != cruntime.StateRunning {
		t.Fatalf("after the first entry: %+v", msgs)
	}
}

// An entry is charged at least the structs it holds: its pod, sandboxes,
// containers and the statuses it may be the last holder of (a
// container's status is the status cache's while the pod lives).
func TestEntryChargedForItsStructs(t *testing.T) {
	const n = 100
	var items []string
	for i := range n {
		items = append(items, fmt.Sprintf("%d=running", i))
	}
	p := pod("a", "p", nil, items...)
	p.Sandboxes = []*Sandbox{{ID: "sb"}}
	for _, c := range p.Containers {
		*c = c.WithStatus(&cruntime.ContainerStatus{ID: c.ID})
	}
	j := New(Options{Epoch: "e"})
	j.Append(podEntry(p, "ContainerStarted"))
	j.mu.Lock()
	got := j.entryLocked(1).size
	j.mu.Unlock()
	min := int(unsafe.Sizeof(Pod{})+unsafe.Sizeof(Sandbox{})) + n*int(unsafe.Sizeof(Container{})+unsafe.Sizeof(cruntime.ContainerStatus{}))
	if got < min {
		t.Errorf("charged %d bytes, its structs alone are %d", got, min)
	}
}

// A container's status is the status cache's, shared: nothing of it can
// be written through a Container. No field is promoted from it (none
// shadows another, none writes through), and no exported field points
// into it or is a status.
func TestContainerStatusNotWritable(t *testing.T) {
	status := reflect.TypeFor[cruntime.ContainerStatus]()
	for f := range reflect.TypeFor[Container]().Fields() {
		if f.Anonymous {
			t.Errorf("Container embeds %s: its fields are promoted, writable and shadowed", f.Type)
			continue
		}
		if !f.IsExported() {
			continue
		}
		if ty := f.Type; ty == status || (ty.Kind() == reflect.Pointer && (ty.Elem() == status || ty.Elem().Kind() != reflect.Struct)) {
			t.Errorf("Container.%s (%s) may point into the shared status", f.Name, ty)
		}
	}
	st := &cruntime.ContainerStatus{State: cruntime.StateExited, ExitCode: 3, Reason: "Error"}
	c := Container{ID: "c"}.WithStatus(st)
	if code, ok := c.ExitCode(); !ok || code != 3 || c.Reason() != "Error" || !c.Shares(st) {
		t.Errorf("the container reads exit code %d (%v), reason %q", code, ok, c.Reason())
	}
	none := Container{ID: "d"}
	if _, ok := none.ExitCode(); ok || none.Reason() != "" || !none.StartedAt().IsZero() || none.Labels().Len() != 0 {
		t.Error("a container without a status does not read as empty")
	}
}

// Append changes nothing it is given: not a container without a status
// (it reads as empty without being given one), not the pod's slices when
// its unchanged containers and sandboxes are shared with the last state.
func TestAppendLeavesItsInput(t *testing.T) {
	j := New(Options{Epoch: "e"})
	j.Append(podEntry(pod("a", "ns", nil, "c0=running", "c1=running"), "ContainerStarted"))
	p := pod("a", "ns", nil, "c0=running", "c1=exited") // c0 unchanged: shared
	p.Sandboxes = []*Sandbox{{ID: "sb"}}
	type copied struct {
		pod        Pod
		containers []*Container
		values     []Container
		sandboxes  []*Sandbox
	}
	snap := func() copied {
		c := copied{pod: *p, containers: slices.Clone(p.Containers), sandboxes: slices.Clone(p.Sandboxes)}
		for _, ct := range p.Containers {
			c.values = append(c.values, *ct)
		}
		return c
	}
	before := snap()
	j.Append(podEntry(p, "ContainerDied"))
	if after := snap(); !reflect.DeepEqual(before, after) {
		t.Errorf("Append changed the pod it was given:\nbefore %+v\nafter  %+v", before, after)
	}
	held, _ := j.Pod("a")
	if held.Containers[1].State != cruntime.StateExited || held.Containers[0].Reason() != "" {
		t.Errorf("the journal holds %+v", held.Containers)
	}
}

// Entry times never run backwards against sequence numbers, however the
// appenders stamp them: an entry stamped before the last one (as the
// event stream's goroutine and the loop once did, each with its own
// reading of the clock) is given the last one's time: expiry, which drops
// the oldest first, may take the first entry for the oldest.
func TestEntryTimesNeverRunBackwards(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := New(Options{Epoch: "e", MaxAge: time.Minute})
		loopNow := time.Now() // the loop read the clock, then ...
		time.Sleep(time.Millisecond)
		j.Append(Entry{Kind: KindRuntime, Runtime: &RuntimeStatus{State: RuntimeEventStreamConnected}}) // ... another writer, stamped by the journal's clock
		j.Append(Entry{Kind: KindRuntime, Time: loopNow, Runtime: &RuntimeStatus{State: RuntimeReachable}})
		j.Append(podEntry(pod("a", "ns", nil, "c=running"), "ContainerStarted"))
		w, err := j.Watch("e-0", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		msgs := collect(t, w)
		if len(msgs) != 3 {
			t.Fatalf("%d messages, want 3", len(msgs))
		}
		for i := 1; i < len(msgs); i++ {
			if msgs[i].Time.Before(msgs[i-1].Time) {
				t.Errorf("entry %d at %v, before entry %d at %v", msgs[i].Cursor.Seq, msgs[i].Time, msgs[i-1].Cursor.Seq, msgs[i-1].Time)
			}
		}
	})
}
