package diagnose

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/internal/textfmt"
)

// Why the shim probe was made (ShimProbe.Reason).
const (
	// ShimProbeListHung: a list call hung (or ran out of time) while
	// ListPodSandbox answered.
	ShimProbeListHung = "listHung"
	// ShimProbeRequested: Options.ProbeShims asked for it.
	ShimProbeRequested = "requested"
)

// shimProbeBudget is how many probe timeouts the shim probe may take in
// all: one for its ListPodSandbox, two for the verbose status calls (a
// call is only started when its whole probe timeout fits).
const shimProbeBudget = 3

// ShimProbe is the report of the shim probe: a verbose PodSandboxStatus
// (what `crictl inspectp` sends) of every listed sandbox. It is a call the
// kubelet never makes, made beyond the relist's calls because on
// containerd 2.x it is the one CRI status call that asks the pod's shim
// rather than containerd's memory: it hangs when the shim does not answer.
type ShimProbe struct {
	// Reason is ShimProbeListHung or ShimProbeRequested.
	Reason string `json:"reason"`
	// Sandboxes is how many sandboxes were to be probed; Answered,
	// Stuck, Failed and Skipped (not probed within the probe's time
	// budget, or interrupted) split them up. Sandboxes that vanished
	// since the listing (NotFound) count as answered.
	Sandboxes int `json:"sandboxes"`
	Answered  int `json:"answered"`
	Stuck     int `json:"stuck"`
	Failed    int `json:"failed,omitempty"`
	Skipped   int `json:"skipped,omitempty"`
	// TookSeconds is how long the shim probe took, its listing included.
	TookSeconds float64 `json:"tookSeconds"`
	// Error tells why the probe could not be made (the endpoint cannot be
	// dialled, the sandboxes cannot be listed), or else the first error of
	// a failed probe.
	Error string `json:"error,omitempty"`
}

// StuckShim is a sandbox whose verbose PodSandboxStatus did not answer
// within the probe timeout: its shim does not answer.
type StuckShim struct {
	// Pod is "namespace/name" (the UID when the sandbox has no name).
	Pod       string `json:"pod"`
	PodUID    string `json:"podUID"`
	SandboxID string `json:"sandboxID"`
	// SandboxState is "running" (ready) or "exited" (not ready).
	SandboxState string `json:"sandboxState"`
	// Seconds is how long the call waited.
	Seconds float64 `json:"seconds"`
	Error   string  `json:"error"`
}

// probedSandbox is a sandbox to probe.
type probedSandbox struct {
	id, uid, name, namespace string
	state                    cruntime.State
}

func (s probedSandbox) ref() string {
	return PodReport{UID: s.uid, Name: s.name, Namespace: s.namespace}.Ref()
}

// shimProbeReason tells whether the shim probe is to be made, and why.
func (d *diagnoser) shimProbeReason(list List) string {
	listed := false // a node-wide ListPodSandbox answered
	for _, c := range list.Calls {
		if c.Call == "ListPodSandbox" && !c.Hung && c.Error == "" {
			listed = true
		}
	}
	if list.Error != "" && listed {
		if c := lastFailed(list.Calls); c != nil && c.Hung {
			return ShimProbeListHung
		}
	}
	if d.opts.ProbeShims && (list.Error == "" || listed) {
		return ShimProbeRequested
	}
	return ""
}

// probeShims makes the shim probe when it is called for (see
// shimProbeReason): it asks every sandbox for its verbose status, at most
// MaxParallel at once, each call bounded by the probe timeout, over a
// connection of the runtime client (RawCRI). When the listing failed, the
// sandboxes are listed again on that connection. The whole probe takes at
// most shimProbeBudget probe timeouts (and a little).
func (d *diagnoser) probeShims(ctx context.Context, pods []*cruntime.Pod, list List) (*ShimProbe, []StuckShim) {
	reason := d.shimProbeReason(list)
	if reason == "" || ctx.Err() != nil {
		return nil, nil
	}
	start := time.Now()
	deadline := start.Add(shimProbeBudget * d.opts.ProbeTimeout)
	sp := &ShimProbe{Reason: reason}
	defer func() { sp.TookSeconds = time.Since(start).Seconds() }()

	raw, ok := d.rt.(RawCRI)
	if !ok {
		sp.Error = "the runtime client makes no raw CRI calls"
		return sp, nil
	}
	rs := raw.RuntimeService()

	var sandboxes []probedSandbox
	if list.Error == "" {
		for _, p := range pods {
			for _, s := range p.Sandboxes {
				if s != nil && s.ID != "" {
					sandboxes = append(sandboxes, probedSandbox{id: s.ID, uid: string(p.UID), name: p.Name,
						namespace: p.Namespace, state: s.State})
				}
			}
		}
	} else {
		cctx, cancel := context.WithTimeout(ctx, d.opts.ProbeTimeout)
		resp, err := rs.ListPodSandbox(cctx, &runtimeapi.ListPodSandboxRequest{})
		cancel()
		if err != nil {
			sp.Error = "ListPodSandbox: " + err.Error()
			return sp, nil
		}
		for _, s := range resp.GetItems() {
			if s.GetId() == "" {
				continue
			}
			m := s.GetMetadata()
			ps := probedSandbox{id: s.GetId(), uid: m.GetUid(), name: m.GetName(), namespace: m.GetNamespace(),
				state: cruntime.StateExited}
			if s.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY {
				ps.state = cruntime.StateRunning
			}
			if ps.uid == "" {
				ps.uid = s.GetLabels()[cruntime.LabelPodUID]
			}
			sandboxes = append(sandboxes, ps)
		}
	}
	sp.Sandboxes = len(sandboxes)

	type result struct {
		probed bool
		// cut: ctx's deadline came before the probe timeout, so an error
		// tells nothing of the shim.
		cut    bool
		took   time.Duration
		err    error
		answer shimAnswer
	}
	results := make([]result, len(sandboxes))
	sem := make(chan struct{}, d.opts.MaxParallel)
	var wg sync.WaitGroup
	for i, s := range sandboxes {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		if time.Until(deadline) < d.opts.ProbeTimeout {
			// No time left for a whole probe timeout: not probed.
			<-sem
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			// Timed from before the deadline is set: a goroutine
			// descheduled between the two on a loaded machine would
			// otherwise report a call that hit its deadline as faster
			// than the probe timeout (the e2e test saw 0.991s of 1s).
			t := time.Now()
			cctx, cancel := context.WithTimeout(ctx, d.opts.ProbeTimeout)
			defer cancel()
			dl, ok := ctx.Deadline()
			cut := ok && dl.Before(t.Add(d.opts.ProbeTimeout))
			resp, err := rs.PodSandboxStatus(cctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: s.id, Verbose: true})
			took := time.Since(t)
			results[i] = result{probed: true, cut: cut, took: took, err: err,
				answer: classifyShimAnswer(resp, err, took, d.opts.ProbeTimeout)}
		}()
	}
	wg.Wait()

	var stuck []StuckShim
	for i, res := range results {
		s := sandboxes[i]
		switch {
		case !res.probed, res.answer != shimAnswered && (res.cut || ctx.Err() != nil):
			// Not probed, or interrupted.
			sp.Skipped++
		case res.answer == shimAnswered:
			sp.Answered++
		case res.answer == shimTimedOut, res.answer == shimAnsweredLate:
			sp.Stuck++
			stuck = append(stuck, StuckShim{Pod: s.ref(), PodUID: s.uid, SandboxID: s.id,
				SandboxState: s.state.String(), Seconds: res.took.Seconds(),
				Error: fmt.Sprintf("verbose PodSandboxStatus: no answer within %v", d.opts.ProbeTimeout)})
		case res.answer == shimUnknown:
			sp.Stuck++
			stuck = append(stuck, StuckShim{Pod: s.ref(), PodUID: s.uid, SandboxID: s.id,
				SandboxState: s.state.String(), Seconds: res.took.Seconds(),
				Error: fmt.Sprintf("verbose PodSandboxStatus: the runtime got no task status from the shim (processStatus %q after %v)",
					processStatusUnknown, res.took.Round(time.Millisecond))})
		default:
			sp.Failed++
			if sp.Error == "" {
				sp.Error = fmt.Sprintf("verbose PodSandboxStatus %q: %v", s.id, res.err)
			}
		}
	}
	// Ready sandboxes first: a stopped pod's shim is gone anyway.
	slices.SortStableFunc(stuck, func(a, b StuckShim) int {
		return cmp.Or(cmp.Compare(stateRank(a.SandboxState), stateRank(b.SandboxState)),
			cmp.Compare(a.Pod, b.Pod), cmp.Compare(a.SandboxID, b.SandboxID))
	})
	return sp, stuck
}

// shimAnswer is what one verbose PodSandboxStatus of the shim probe
// tells of the sandbox's shim.
type shimAnswer int

const (
	// shimFailed: an error that says nothing of the shim (see the
	// probe's Failed).
	shimFailed shimAnswer = iota
	// shimAnswered: a status within the probe timeout whose task status
	// the runtime got from the shim, or NotFound (the sandbox is gone).
	shimAnswered
	// shimTimedOut: no answer within the probe timeout.
	shimTimedOut
	// shimAnsweredLate: a status, but only once the probe timeout had
	// passed: the call raced its own deadline (see classifyShimAnswer).
	shimAnsweredLate
	// shimUnknown: a status in time, but its task status is "unknown":
	// the runtime asked the shim and gave up waiting.
	shimUnknown
)

// processStatusUnknown is the processStatus of containerd's verbose
// sandbox info when the shim did not answer containerd's task State call.
const processStatusUnknown = "unknown"

// classifyShimAnswer tells what a verbose PodSandboxStatus that took took,
// with the probe timeout timeout, says of the sandbox's shim.
//
// A stopped shim does not always make the call fail: containerd 2.x
// (plugins/services/tasks, getProcessState) bounds its task State call to
// the shim by the caller's deadline and by its own 2 s task state
// timeout, and when that call fails it logs the error and answers the
// task's status as UNKNOWN, without an error. The verbose info then says
// "processStatus":"unknown", and the answer leaves containerd as the
// caller's deadline expires (containerd's copy of the deadline runs a
// transit time behind the caller's): on a loaded machine the caller's
// gRPC client may read that answer before its own deadline fires, so an
// error-free answer at the probe timeout is no answer of the shim either.
// CI saw the stopped shim of the e2e test "answer" that way in one run
// of `pleg diagnose` and hang in the next.
func classifyShimAnswer(resp *runtimeapi.PodSandboxStatusResponse, err error, took, timeout time.Duration) shimAnswer {
	switch {
	case err == nil && verboseProcessStatus(resp) == processStatusUnknown:
		return shimUnknown
	case err == nil && took >= timeout:
		return shimAnsweredLate
	case err == nil, status.Code(err) == codes.NotFound:
		return shimAnswered
	case status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded):
		return shimTimedOut
	}
	return shimFailed
}

// verboseProcessStatus returns the sandbox task's processStatus from the
// verbose info of a PodSandboxStatus answer, as containerd reports it
// (its "info" JSON); "" when the answer has none (another runtime, a
// non-verbose answer).
func verboseProcessStatus(resp *runtimeapi.PodSandboxStatusResponse) string {
	info := resp.GetInfo()["info"]
	if info == "" {
		return ""
	}
	var si struct {
		ProcessStatus string `json:"processStatus"`
	}
	if json.Unmarshal([]byte(info), &si) != nil {
		return ""
	}
	return si.ProcessStatus
}

func stateRank(s string) int {
	if s == cruntime.StateRunning.String() {
		return 0
	}
	return 1
}

// RawCRI is a runtime client that also offers raw CRI calls on its
// connection, as *cri.Client does; the shim probe needs it.
type RawCRI interface {
	RuntimeService() runtimeapi.RuntimeServiceClient
}

// shimNote is the verdict's account of the stuck shims ("" when there are
// none).
func shimNote(stuck []StuckShim) string {
	switch len(stuck) {
	case 0:
		return ""
	case 1:
		return fmt.Sprintf("the shim of pod %s does not answer (crictl inspectp %s hangs)", stuck[0].Pod, textfmt.ShortID(stuck[0].SandboxID))
	}
	names := make([]string, 0, 4)
	for i, s := range stuck {
		if i == 3 {
			names = append(names, fmt.Sprintf("and %d more", len(stuck)-3))
			break
		}
		names = append(names, fmt.Sprintf("%s (%s)", s.Pod, textfmt.ShortID(s.SandboxID)))
	}
	return fmt.Sprintf("the shims of %d pods do not answer (crictl inspectp hangs): %s", len(stuck), strings.Join(names, ", "))
}
