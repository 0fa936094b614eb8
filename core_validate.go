package pleg

import (
	"fmt"

	"github.com/podlifecycle/pleg/cruntime"
)

// ErrMalformed is wrapped by the errors the generator returns for runtime
// answers it cannot use: a nil pod, container or status where the
// cruntime.Runtime contract promises one. A listing or inspection that
// carries one fails as a whole, like a failed call, so that nothing is
// half-applied and nothing panics.
var ErrMalformed = cruntime.ErrMalformed

// checkPods rejects a listing with a nil pod, sandbox or container.
func checkPods(pods []*cruntime.Pod) error {
	for i, p := range pods {
		if p == nil {
			return fmt.Errorf("%w: ListPods returned a nil pod at index %d", ErrMalformed, i)
		}
		if err := checkPod(p); err != nil {
			return err
		}
	}
	return nil
}

// checkPod rejects a pod with a nil sandbox or container; nil is a valid
// answer of ListPod (nothing listed).
func checkPod(p *cruntime.Pod) error {
	if p == nil {
		return nil
	}
	for i, s := range p.Sandboxes {
		if s == nil {
			return fmt.Errorf("%w: pod %s/%s (%s) has a nil sandbox at index %d", ErrMalformed, p.Namespace, p.Name, p.UID, i)
		}
	}
	for i, c := range p.Containers {
		if c == nil {
			return fmt.Errorf("%w: pod %s/%s (%s) has a nil container at index %d", ErrMalformed, p.Namespace, p.Name, p.UID, i)
		}
	}
	return nil
}

// checkStatus rejects a nil status, or one with nil entries, returned
// without an error for pod.
func checkStatus(pod *cruntime.Pod, s *cruntime.PodStatus) error {
	if s == nil {
		return fmt.Errorf("%w: PodStatus returned neither a status nor an error for pod %s", ErrMalformed, podRef(pod))
	}
	for i, x := range s.SandboxStatuses {
		if x == nil {
			return fmt.Errorf("%w: the status of pod %s has a nil sandbox status at index %d", ErrMalformed, podRef(pod), i)
		}
	}
	for i, x := range s.ContainerStatuses {
		if x == nil {
			return fmt.Errorf("%w: the status of pod %s has a nil container status at index %d", ErrMalformed, podRef(pod), i)
		}
	}
	return nil
}
