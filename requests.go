package pleg

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// The queue of single-pod relist requests (RequestRelist, runtime event
// hints). Its rules for which requests make a call are the core's
// (covered, in core.go) and the shell's (podrelist.go).

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
