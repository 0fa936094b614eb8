package pleg

import (
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"k8s.io/apimachinery/pkg/types"
)

// The effects of a Step besides calls (Ready): cache operations, events to
// publish, and notes for the logs and metrics.

type cacheOpKind uint8

const (
	cacheSet      cacheOpKind = iota // Set(uid, status, err, at)
	cacheDelete                      // Delete(uid)
	cacheObserved                    // MarkObserved(uid, at)
	cacheTime                        // UpdateTime(at), the held pods left out
)

// cacheOp is one operation on the pod status cache.
type cacheOp struct {
	kind   cacheOpKind
	uid    types.UID
	status *cruntime.PodStatus
	err    error
	at     time.Time
	held   []types.UID
}

// publication is one pod's outcome to deliver: its events (in order), the
// listing they lead to (nil: the pod is gone; last is the one before) and
// its fresh status. relist says whether a global relist found it
// (otherwise a hint did).
type publication struct {
	uid    types.UID
	pod    *cruntime.Pod
	last   *cruntime.Pod
	status *cruntime.PodStatus
	events []Event
	relist bool
	// identities are the pod's containers' identities known (not to be
	// modified: the core replaces the map when it learns more).
	identities map[string]*cruntime.Identity
	// update: only identities changed (events is PodUpdated alone): for
	// the journal, not for the kubelet-compatible channel.
	update bool
}

type noteKind uint8

const (
	noteRelistInterval    noteKind = iota // d: since the last successful listing's start
	noteEarlyRelist                       // a global relist started early for hints
	noteListFailed                        // err: a global listing failed
	noteGauges                            // n: running pods; byState: containers per state
	noteInspectionFailed                  // uid, pod, err
	noteTimeout                           // uid, pod, err (*InspectionTimeoutError), op; single: a single-pod relist's call
	noteAbandonedReturned                 // uid, pod, d: an abandoned call returned after d
	notePodRelistFailed                   // uid, pod, err: a single-pod list call failed
	notePodRelistDone                     // d: a single-pod relist's duration
	noteStatusItems                       // n fetched, reused
	noteHintSkipped                       // uid, reason, container: a hint made no call
	noteHintDropped                       // uid: the queue was full
	noteHintDeferred                      // uid, reason: a hint waits for the budget
	noteHintLatency                       // d: from a runtime event to its delivered event
	noteIdentityFailed                    // uid, pod, err: an identity call failed
	noteUnannounced                       // uid, reason (its kind): a global relist found a change no event announced
)

// Reasons of noteHintSkipped and noteHintDeferred, the label values of
// pleg_pod_relist_requests_skipped_total and
// pleg_pod_relist_requests_deferred_total.
const (
	SkipCovered    = "covered"     // a global listing that started later shows it
	SkipStaleEvent = "stale_event" // the event predates the last global listing
	SkipUnchanged  = "unchanged"   // the event names a state the records already show
	DeferBudget    = "budget"      // no token left
	DeferSpacing   = "spacing"     // the pod was relisted on its own too recently
)

// note is something to log or count.
type note struct {
	kind      noteKind
	uid       types.UID
	pod       *cruntime.Pod
	err       error
	d         time.Duration
	n, reused int
	byState   [4]int
	op        string
	reason    string
	container string
	single    bool
}
