package pleg

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"k8s.io/apimachinery/pkg/types"
)

// FuzzCore steps the core with random interleavings of everything that
// can happen: the runtime's listing changing, time passing (timeouts, the
// budget, the period), global relists, calls returning in any order (with
// errors, late, malformed), hints (some with event payloads, some stale)
// and reinspection requests. It checks, after every step:
//
//   - nothing panics; a pod never has two calls out; at most slots are
//     active;
//   - no event twice, none out of thin air: the events delivered for a pod
//     are exactly the transitions between the listing subscribers were
//     last told about and the one they lead to (PodSync when none), that
//     one being the listing with what fresher statuses showed, through
//     what runtime events saw in between;
//
// and at the end, once the runtime stops changing and answers every call:
//
//   - no transition lost: every pod subscribers were told about has the
//     runtime's listing, and every pod the runtime lists was told about.
func FuzzCore(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte{0, 0, 0, 9, 9, 9, 1, 1, 1, 200, 17, 33, 65, 129, 2, 2, 2})
	f.Add([]byte("crash loop, hung pod, stale hint, runtime restart"))
	f.Add([]byte{2, 3, 3, 3, 4, 7, 4, 9, 3, 0, 3, 1, 1, 1, 1, 1, 3, 3, 6, 2, 3, 3, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		fz := newFuzzer(t, data)
		for steps := 0; !fz.done() && steps < 300; steps++ {
			fz.step()
		}
		fz.converge()
	})
}

var fuzzPods = []types.UID{"a", "b", "c", "d"}

type fuzzer struct {
	*harness
	data []byte
	pos  int
	// told: the listing each pod's delivered events lead to (the
	// reference model of a subscriber).
	told map[types.UID]*cruntime.Pod
}

func newFuzzer(t *testing.T, data []byte) *fuzzer {
	h := newHarness(t)
	h.c.cfg = coreConfig{period: time.Second, slots: 2, timeout: 2 * time.Second, statusTimeout: 2 * time.Second,
		budget: hintBudget{rate: 3, burst: 2, spacing: 300 * time.Millisecond, early: 200 * time.Millisecond, queue: 3}, check: true}
	return &fuzzer{harness: h, data: data, told: map[types.UID]*cruntime.Pod{}}
}

func (fz *fuzzer) done() bool { return fz.pos >= len(fz.data) }

func (fz *fuzzer) byte() byte {
	if fz.done() {
		return 0
	}
	b := fz.data[fz.pos]
	fz.pos++
	return b
}

// listing makes one pod's listing: nil (not listed) or up to four items
// from a small pool of IDs per pod, in any state.
func (fz *fuzzer) listing(uid types.UID) *cruntime.Pod {
	b := fz.byte()
	if b%5 == 0 {
		return nil
	}
	p := &cruntime.Pod{UID: uid, Name: "name-" + string(uid), Namespace: "ns"}
	states := []cruntime.State{cruntime.StateCreated, cruntime.StateRunning, cruntime.StateExited, cruntime.StateUnknown}
	for i := range 4 {
		s := fz.byte()
		if s%3 == 0 {
			continue
		}
		c := &cruntime.Container{ID: fmt.Sprintf("%s-%d", uid, i), State: states[int(s>>2)%4]}
		if i == 0 {
			p.Sandboxes = append(p.Sandboxes, c)
		} else {
			p.Containers = append(p.Containers, c)
		}
	}
	return p
}

// apply checks and records what one step published. observed are the
// states runtime events had shown for each pod before the step.
func (fz *fuzzer) apply(rd Ready, observed map[types.UID]map[string]cruntime.State) {
	t := fz.t
	for _, req := range rd.Calls {
		fz.out[req.ID] = req
	}
	for _, p := range rd.Publish {
		if p.update {
			// Identities learnt: the pod's listing is what was told.
			if changed(fz.told[p.uid], p.pod) || len(p.events) != 1 || p.events[0].Type != "PodUpdated" {
				t.Fatalf("pod %s: an identity update %v for %s, told %s", p.uid, p.events, dump(p.pod), dump(fz.told[p.uid]))
			}
			continue
		}
		diff := Diff(p.uid, fz.told[p.uid], p.pod)
		if mid := withObserved(fz.told[p.uid], p.pod, observed[p.uid]); mid != nil {
			// A state runtime events saw between what was told and the
			// listing comes first.
			diff = append(Diff(p.uid, fz.told[p.uid], mid), Diff(p.uid, mid, p.pod)...)
		}
		var want []string
		for _, e := range diff {
			if e.Type != ContainerChanged {
				want = append(want, string(e.Type)+" "+e.ContainerID)
			}
		}
		if len(diff) == 0 {
			want = []string{string(PodSync) + " "}
		}
		var got []string
		for _, e := range p.events {
			got = append(got, string(e.Type)+" "+e.ContainerID)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("pod %s: delivered %q, want %q (told %s, now %s)", p.uid, got, want, dump(fz.told[p.uid]), dump(p.pod))
		}
		if p.pod == nil {
			delete(fz.told, p.uid)
		} else {
			fz.told[p.uid] = p.pod
		}
	}
	fz.checkInvariants()
}

func (fz *fuzzer) stepCore(in input) {
	observed := map[types.UID]map[string]cruntime.State{}
	for uid, r := range fz.c.records {
		if len(r.observed) > 0 {
			observed[uid] = maps.Clone(r.observed)
		}
	}
	rd := fz.c.Step(fz.now, in)
	if rd.Broken != nil {
		fz.t.Fatalf("the core broke an invariant: %v", rd.Broken)
	}
	fz.apply(rd, observed)
	// Queries change nothing: the token bucket is as the step left it.
	before := fz.c.hints
	fz.c.Settled()
	fz.c.Wake()
	if after := fz.c.hints; after.tokens != before.tokens || !after.tokensAt.Equal(before.tokensAt) || after.started != before.started {
		fz.t.Fatalf("a query changed the token bucket: %+v -> %+v", before, after)
	}
}

// waiting is what every call out waits on, as the pool would report.
func (fz *fuzzer) waiting() map[callID]trackedCall {
	w := map[callID]trackedCall{}
	for id := range fz.out {
		w[id] = trackedCall{op: "container_status"}
	}
	return w
}

// returnRandom returns one call out, picked by the next byte; how it
// returns is picked too: the runtime's answer, an error, or a malformed
// answer.
func (fz *fuzzer) returnRandom(how byte) {
	if len(fz.out) == 0 {
		return
	}
	ids := make([]callID, 0, len(fz.out))
	for id := range fz.out {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	id := ids[int(fz.byte())%len(ids)]
	req := fz.out[id]
	delete(fz.out, id)
	if how%3 == 1 && req.Kind == callStatus {
		// The runtime moved on since the listing: the status shows the
		// items as the runtime lists them now.
		if p := fz.pods[req.UID]; p != nil {
			for _, it := range append(slices.Clone(p.Sandboxes), p.Containers...) {
				fz.moved[it.ID] = it.State
			}
		}
	}
	in := fz.answer(req, how%7 == 0)
	clear(fz.moved)
	if how%11 == 5 {
		switch in := in.(type) {
		case listed:
			fz.stepCore(listed{call: in.call, pods: append(in.pods, nil)})
			return
		case podListed:
			if in.pod != nil {
				p := *in.pod
				p.Containers = append(slices.Clone(p.Containers), nil)
				fz.stepCore(podListed{call: in.call, pod: &p})
				return
			}
		case statusFetched:
			if in.status != nil {
				in.status = &cruntime.PodStatus{UID: in.status.UID, ContainerStatuses: []*cruntime.ContainerStatus{nil}}
			} else {
				in.sandboxes = append(in.sandboxes, nil)
			}
			fz.stepCore(in)
			return
		}
	}
	fz.stepCore(in)
}

func (fz *fuzzer) step() {
	op := fz.byte()
	uid := fuzzPods[int(op>>4)%len(fuzzPods)]
	switch op % 8 {
	case 0, 1:
		if p := fz.listing(uid); p != nil {
			fz.pods[uid] = p
		} else {
			delete(fz.pods, uid)
		}
	case 2:
		fz.now = fz.now.Add(time.Duration(fz.byte()) * 20 * time.Millisecond)
		fz.stepCore(tick{waiting: fz.waiting()})
	case 3, 4:
		fz.returnRandom(fz.byte())
	case 5:
		in := hintIn{uid: uid, at: fz.now.Add(time.Duration(int(fz.byte())-128) * 10 * time.Millisecond)}
		if b := fz.byte(); b%2 == 0 {
			in.event, in.eventType = true, cruntime.EventType(b>>1%4)
			in.container = fmt.Sprintf("%s-%d", uid, b>>3%4)
		}
		fz.stepCore(in)
	case 6:
		if op&0x80 != 0 {
			fz.stepCore(identityIn{wanted: op&0x40 != 0})
		} else {
			fz.stepCore(reinspectIn{uid: uid})
		}
	case 7:
		fz.stepCore(relistNow{})
	}
}

// converge stops changing the runtime and answers every call, through
// global relists, until nothing is out; then subscribers must have been
// told the runtime's listing of every pod.
func (fz *fuzzer) converge() {
	t := fz.t
	drain := func() {
		for i := 0; len(fz.out) > 0; i++ {
			if i > 1000 {
				t.Fatalf("calls keep coming: %v", fz.out)
			}
			ids := make([]callID, 0, len(fz.out))
			for id := range fz.out {
				ids = append(ids, id)
			}
			slices.Sort(ids)
			req := fz.out[ids[0]]
			delete(fz.out, ids[0])
			fz.stepCore(fz.answer(req, false))
		}
	}
	for range 3 {
		drain()
		fz.now = fz.now.Add(time.Minute) // past every deadline and spacing, the budget full
		fz.stepCore(tick{waiting: fz.waiting()})
		drain()
		fz.stepCore(relistNow{})
		drain()
	}
	for _, uid := range fuzzPods {
		want := fz.pods[uid]
		if changed(fz.told[uid], want) {
			t.Fatalf("pod %s: subscribers were told %s, the runtime lists %s", uid, dump(fz.told[uid]), dump(want))
		}
	}
}
