package pleg

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"k8s.io/apimachinery/pkg/types"
)

// FuzzCore drives the core with random listings (global and single-pod,
// current and stale, some malformed), random inspection outcomes and
// reinspection requests, and checks it against a reference model of what
// subscribers were told:
//
//   - nothing panics, and malformed answers never reach the core;
//   - no event twice: the events of every successful inspection are exactly
//     the transitions between the listing subscribers were last told about
//     and the inspected one, which is never older than the records;
//   - no transition lost: after a global relist, every listed pod either
//     has been told its listing, or is retried: it is flagged, and the next
//     global relist inspects it.
func FuzzCore(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte{0, 0, 0, 9, 9, 9, 1, 1, 1, 200, 17, 33, 65, 129, 2, 2, 2})
	f.Add([]byte("crash loop, hung pod, stale hint, runtime restart"))
	f.Fuzz(func(t *testing.T, data []byte) {
		fz := &fuzzer{data: data, c: newCore(false), told: map[types.UID]*cruntime.Pod{}, now: time.Unix(1_700_000_000, 0)}
		for steps := 0; !fz.done() && steps < 200; steps++ {
			fz.step(t)
		}
	})
}

type fuzzer struct {
	data []byte
	pos  int
	c    *core
	now  time.Time
	// told: the listing each pod's delivered events lead to (the
	// reference model of a subscriber).
	told map[types.UID]*cruntime.Pod
	// retry: pods whose last inspection failed, which the next global
	// relist must inspect.
	retry map[types.UID]bool
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

var fuzzPods = []types.UID{"a", "b", "c", "d"}

// listing makes one pod's listing: nil (not listed) or up to four items
// from a small pool of IDs per pod, in any state, sometimes a nil item.
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
		switch {
		case s == 255:
			p.Containers = append(p.Containers, nil) // malformed
		case i == 0:
			p.Sandboxes = append(p.Sandboxes, c)
		default:
			p.Containers = append(p.Containers, c)
		}
	}
	return p
}

// outcome answers an inspection of w: success, failure, a timeout, or a
// malformed status (which the shell turns into an error).
func (fz *fuzzer) outcome(w work) (*cruntime.PodStatus, error) {
	if w.pod == nil {
		return nil, nil
	}
	var status *cruntime.PodStatus
	var err error
	switch fz.byte() % 6 {
	case 0:
		err = errStatus
	case 1:
		err = &InspectionTimeoutError{UID: w.uid, Operation: "container_status"}
	case 2:
		status = &cruntime.PodStatus{UID: w.uid, ContainerStatuses: []*cruntime.ContainerStatus{nil}}
	default:
		status = &cruntime.PodStatus{UID: w.uid}
		for _, c := range w.pod.Containers {
			status.ContainerStatuses = append(status.ContainerStatuses, &cruntime.ContainerStatus{ID: c.ID, State: c.State, ExitCode: 7})
		}
		for _, s := range w.pod.Sandboxes {
			status.SandboxStatuses = append(status.SandboxStatuses, &cruntime.SandboxStatus{ID: s.ID, State: s.State})
		}
	}
	if err == nil {
		err = checkStatus(w.pod, status) // as the shell's call does
	}
	if err != nil {
		status = nil
	}
	return status, err
}

// inspect steps the core with an outcome for w and checks it against the
// model.
func (fz *fuzzer) inspect(t *testing.T, w work) {
	status, err := fz.outcome(w)
	o := fz.c.inspected(w, status, err, fz.now)
	if o.Stale {
		if w.gen == fz.c.gen {
			t.Fatalf("an inspection of the current generation was dropped as stale: %+v", w)
		}
		return
	}
	if w.gen != fz.c.gen {
		t.Fatalf("an outcome of generation %d applied in generation %d", w.gen, fz.c.gen)
	}
	if !o.OK {
		if err == nil || len(o.Events) > 0 {
			t.Fatalf("a failed inspection delivered %v (err %v)", o.Events, err)
		}
		fz.retry[w.uid] = true
		return
	}
	delete(fz.retry, w.uid)
	var want []string
	for _, e := range Diff(w.uid, fz.told[w.uid], w.pod) {
		if e.Type != ContainerChanged {
			want = append(want, string(e.Type)+" "+e.ContainerID)
		}
	}
	var got []string
	for _, e := range o.Events {
		if e.Type == PodSync {
			continue
		}
		got = append(got, string(e.Type)+" "+e.ContainerID)
		if e.PodUID != w.uid {
			t.Fatalf("event for %s from the inspection of %s", e.PodUID, w.uid)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pod %s: delivered %v, want the transitions from what it was told: %v", w.uid, got, want)
	}
	if o.State != w.pod {
		t.Fatalf("pod %s: the events lead to another listing than the inspected one", w.uid)
	}
	if w.pod == nil {
		delete(fz.told, w.uid)
	} else {
		fz.told[w.uid] = w.pod
	}
}

func (fz *fuzzer) step(t *testing.T) {
	fz.now = fz.now.Add(time.Second)
	if fz.retry == nil {
		fz.retry = map[types.UID]bool{}
	}
	switch op := fz.byte() % 4; op {
	case 0, 1:
		fz.globalRelist(t)
	case 2: // a single-pod relist, current or stale
		uid := fuzzPods[int(fz.byte())%len(fuzzPods)]
		p := fz.listing(uid)
		if checkPod(p) != nil {
			return
		}
		gen := fz.c.gen
		if fz.byte()%4 == 0 && gen > 0 {
			gen--
		}
		w, ok, stale := fz.c.podListed(uid, p, gen, fz.byte()%8 == 0)
		if stale != (gen != fz.c.gen) {
			t.Fatalf("podListed stale=%v for generation %d of %d", stale, gen, fz.c.gen)
		}
		if !ok {
			if !stale && len(Diff(uid, fz.told[uid], p)) > 0 {
				t.Fatalf("pod %s: a changed single-pod listing needs no inspection", uid)
			}
			return
		}
		switch fz.byte() % 4 {
		case 0:
			// A global relist runs while the status call is out: the
			// outcome is then stale.
			fz.now = fz.now.Add(time.Second)
			fz.globalRelist(t)
		case 1:
			// The status call timed out: the shell steps the core with
			// the timeout.
			o := fz.c.inspected(w, nil, &InspectionTimeoutError{UID: uid, Operation: "container_status"}, fz.now)
			if !o.Stale {
				fz.retry[uid] = true
			}
			return
		}
		fz.inspect(t, w)
	case 3: // a single-pod list call timed out
		uid := fuzzPods[int(fz.byte())%len(fuzzPods)]
		if fz.c.listTimedOut(uid, fz.c.gen) {
			fz.retry[uid] = true
		}
	}
}

// globalRelist steps a global relist with a random listing and checks the
// model after it.
func (fz *fuzzer) globalRelist(t *testing.T) {
	var pods []*cruntime.Pod
	for _, uid := range fuzzPods {
		if p := fz.listing(uid); p != nil {
			pods = append(pods, p)
		}
	}
	if errors.Is(checkPods(pods), ErrMalformed) {
		return // the shell fails the relist: the core is not stepped
	}
	var requested []types.UID
	if b := fz.byte(); b%4 == 0 {
		requested = append(requested, fuzzPods[int(b>>2)%len(fuzzPods)])
	}
	todo := fz.c.listed(fz.now, pods, requested)
	inTodo := map[types.UID]bool{}
	for _, w := range todo {
		inTodo[w.uid] = true
	}
	for uid := range fz.retry {
		if !inTodo[uid] {
			t.Fatalf("pod %s failed its last inspection and the next relist does not retry it", uid)
		}
	}
	clear(fz.retry) // rebuilt by this relist's outcomes
	for _, w := range todo {
		fz.inspect(t, w)
	}
	// Nothing lost: every listed pod was told its listing, or is flagged
	// for the next relist.
	for _, p := range pods {
		if len(Diff(p.UID, fz.told[p.UID], p)) > 0 && !fz.c.flagged(p.UID) {
			t.Fatalf("pod %s: its listing changed and it is neither told nor flagged", p.UID)
		}
	}
}
