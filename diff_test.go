package pleg

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/podlifecycle/pleg/cruntime"
)

func TestTransitionTable(t *testing.T) {
	// The full state table of docs/semantics.md, "States and transitions".
	R, E, U, N := stateRunning, stateExited, stateUnknown, stateNonExistent
	tests := []struct {
		old, new state
		want     []EventType
	}{
		{R, R, nil}, {R, E, []EventType{ContainerDied}}, {R, U, []EventType{ContainerChanged}}, {R, N, []EventType{ContainerDied, ContainerRemoved}},
		{E, R, []EventType{ContainerStarted}}, {E, E, nil}, {E, U, []EventType{ContainerChanged}}, {E, N, []EventType{ContainerRemoved}},
		{U, R, []EventType{ContainerStarted}}, {U, E, []EventType{ContainerDied}}, {U, U, nil}, {U, N, []EventType{ContainerDied, ContainerRemoved}},
		{N, R, []EventType{ContainerStarted}}, {N, E, []EventType{ContainerDied}}, {N, U, []EventType{ContainerChanged}}, {N, N, nil},
	}
	for _, tt := range tests {
		if got := transition(nil, tt.old, tt.new); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%v -> %v: got %v, want %v", tt.old, tt.new, got, tt.want)
		}
	}
}

func TestDiff(t *testing.T) {
	tests := []struct {
		name     string
		old, new *cruntime.Pod
		want     []string
	}{
		{"both nil", nil, nil, nil},
		{"new pod", nil, pod("a", "c1=running", "c2=created", "s:s1=running"), []string{"a ContainerStarted c1", "a ContainerChanged c2", "a ContainerStarted s1"}},
		{"gone pod", pod("a", "c1=running", "c2=exited", "s:s1=exited"), nil, []string{"a ContainerDied c1", "a ContainerRemoved c1", "a ContainerRemoved c2", "a ContainerRemoved s1"}},
		{"same", pod("a", "c1=running"), pod("a", "c1=running"), nil},
		{"created and unknown are the same state", pod("a", "c1=created"), pod("a", "c1=unknown"), nil},
		{"walk order: old containers, old sandboxes, new containers, new sandboxes",
			pod("a", "c1=running", "s:s1=running"), pod("a", "c2=running", "s:s2=running", "s:s1=exited", "c1=exited"),
			[]string{"a ContainerDied c1", "a ContainerDied s1", "a ContainerStarted c2", "a ContainerStarted s2"}},
		{"container becomes sandbox id (first occurrence wins)", pod("a", "x=running"), pod("a", "s:x=exited"), []string{"a ContainerDied x"}},
		{"duplicate ids in one listing", nil, pod("a", "c1=running", "c1=exited"), []string{"a ContainerStarted c1"}},
		{"empty ids are skipped", nil, &cruntime.Pod{UID: "a", Containers: []*cruntime.Container{{ID: "", State: cruntime.StateRunning}}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, e := range Diff("a", tt.old, tt.new) {
				got = append(got, fmt.Sprintf("%s %s %s", e.PodUID, e.Type, e.ContainerID))
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// FuzzDiff checks the diff's invariants on arbitrary pairs of listings:
// no panic; applying the events' target states to old gives new; an ID
// has at most two events and Removed is always last; the same pair always
// gives the same events.
func FuzzDiff(f *testing.F) {
	f.Add([]byte{0x01, 0x12, 0x23}, []byte{0x02, 0x13})
	f.Add([]byte{}, []byte{0x31, 0x31, 0x80})
	f.Add([]byte{0xff, 0x00}, []byte{})
	f.Fuzz(func(t *testing.T, a, b []byte) {
		old, new := fuzzPod(a), fuzzPod(b)
		events := Diff("p", old, new)
		if !reflect.DeepEqual(events, Diff("p", old, new)) {
			t.Fatal("not deterministic")
		}
		if changed(old, new) != (len(events) > 0) {
			t.Fatalf("changed %v, but Diff returns %v; old %v new %v", changed(old, new), events, dump(old), dump(new))
		}
		// Replay: the state each ID ends in must be its state in new.
		got := map[string]state{}
		for _, p := range []*cruntime.Pod{old} {
			if p == nil {
				continue
			}
			for _, c := range append(append([]*cruntime.Container{}, p.Containers...), p.Sandboxes...) {
				if _, ok := got[c.ID]; !ok && c.ID != "" {
					st, _, _ := find(old, c.ID)
					got[c.ID] = st
				}
			}
		}
		count := map[string]int{}
		for _, e := range events {
			count[e.ContainerID]++
			if got[e.ContainerID] == stateNonExistent && e.Type == ContainerRemoved {
				t.Fatalf("removed twice: %v", events)
			}
			switch e.Type {
			case ContainerStarted:
				got[e.ContainerID] = stateRunning
			case ContainerDied:
				got[e.ContainerID] = stateExited
			case ContainerChanged:
				got[e.ContainerID] = stateUnknown
			case ContainerRemoved:
				got[e.ContainerID] = stateNonExistent
			default:
				t.Fatalf("unexpected event type %v", e.Type)
			}
		}
		for id, n := range count {
			if n > 2 {
				t.Fatalf("%d events for %s: %v", n, id, events)
			}
		}
		ids := map[string]bool{}
		for _, p := range []*cruntime.Pod{old, new} {
			if p == nil {
				continue
			}
			for _, c := range append(append([]*cruntime.Container{}, p.Containers...), p.Sandboxes...) {
				ids[c.ID] = true
			}
		}
		for id := range ids {
			if id == "" {
				continue
			}
			want, _, _ := find(new, id)
			have, ok := got[id]
			if !ok {
				have = stateNonExistent
			}
			if have != want {
				t.Fatalf("id %s ends %v, want %v; old %v new %v events %v", id, have, want, dump(old), dump(new), events)
			}
		}
	})
}

// fuzzPod decodes bytes into a listing: each byte is one item, the low
// nibble picking the ID (0 is empty), bits 4-5 the state, bit 6 sandbox;
// an empty input is a missing pod.
func fuzzPod(b []byte) *cruntime.Pod {
	if len(b) == 0 {
		return nil
	}
	p := &cruntime.Pod{UID: "p"}
	for _, x := range b {
		id := ""
		if x&0x0f != 0 {
			id = fmt.Sprintf("id%d", x&0x0f)
		}
		c := &cruntime.Container{ID: id, State: cruntime.State((x >> 4) & 0x3)}
		if x&0x40 != 0 {
			p.Sandboxes = append(p.Sandboxes, c)
		} else {
			p.Containers = append(p.Containers, c)
		}
	}
	return p
}

func dump(p *cruntime.Pod) string {
	if p == nil {
		return "<nil>"
	}
	s := ""
	for _, c := range p.Containers {
		s += fmt.Sprintf("%s=%s ", c.ID, c.State)
	}
	for _, c := range p.Sandboxes {
		s += fmt.Sprintf("s:%s=%s ", c.ID, c.State)
	}
	return s
}
