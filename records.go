package pleg

import (
	"sync"
	"time"

	"github.com/podlifecycle/pleg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// record is what the generator knows of one pod: old is the listing that
// events have been emitted for, current the listing of this pass (nil: the
// pod is not listed).
type record struct {
	old, current *runtime.Pod
}

// pod returns the most recent listing of the record.
func (r *record) pod() *runtime.Pod {
	if r.current != nil {
		return r.current
	}
	return r.old
}

// podRequest is a queued single-pod relist.
type podRequest struct {
	uid types.UID
	at  time.Time
}

// requestQueue is the bounded, coalescing queue of single-pod relist
// requests. Requests for a pod already queued keep their place and take the
// later request time.
type requestQueue struct {
	mu    sync.Mutex
	limit int
	order []types.UID
	at    map[types.UID]time.Time
	wake  chan struct{} // capacity 1: "there is something to do"
}

func (q *requestQueue) init(limit int) {
	q.limit = limit
	q.at = make(map[types.UID]time.Time)
	q.wake = make(chan struct{}, 1)
}

func (q *requestQueue) add(uid types.UID, at time.Time) bool {
	q.mu.Lock()
	if prev, ok := q.at[uid]; ok {
		if at.After(prev) {
			q.at[uid] = at
		}
		q.mu.Unlock()
		return true
	}
	if len(q.order) >= q.limit {
		q.mu.Unlock()
		return false
	}
	q.at[uid] = at
	q.order = append(q.order, uid)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return true
}

func (q *requestQueue) pop() (podRequest, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.order) == 0 {
		return podRequest{}, false
	}
	uid := q.order[0]
	q.order[0] = ""
	q.order = q.order[1:]
	at := q.at[uid]
	delete(q.at, uid)
	return podRequest{uid: uid, at: at}, true
}

func (q *requestQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.order)
}
