package pleg

import "fmt"

// invariants returns the first rule of the core's state that its state
// breaks after a step, or nil. The rules tie the records, the calls out
// and the hint queue together; Step checks them when cfg.check is set (the
// scripts and the fuzzer set it), and reports a break in Ready.Broken.
// Production generators do not pay for the check.
func (c *core) invariants() error {
	perPod := make(map[string]int, len(c.calls))
	active, abandoned := 0, 0
	for id, k := range c.calls {
		if k.id != id {
			return fmt.Errorf("call %d is filed as call %d", k.id, id)
		}
		if k.kind == callList {
			continue // not counted: a listing takes no slot
		}
		if k.abandoned {
			abandoned++
		} else {
			active++
		}
		perPod[string(k.uid)]++
		if perPod[string(k.uid)] > 1 {
			return fmt.Errorf("pod %s has %d calls out; one at most", k.uid, perPod[string(k.uid)])
		}
		if r := c.records[k.uid]; r == nil || r.call != k {
			return fmt.Errorf("call %d for pod %s is out, but the pod's record does not hold it", k.id, k.uid)
		}
	}
	if active != c.active || active > c.cfg.slots {
		return fmt.Errorf("%d calls active (the core counts %d), %d slots", active, c.active, c.cfg.slots)
	}
	if abandoned != c.abandoned {
		return fmt.Errorf("%d calls abandoned (the core counts %d)", abandoned, c.abandoned)
	}
	queued := make(map[string]bool, len(c.hints.order))
	for _, uid := range c.hints.order {
		r := c.records[uid]
		if r == nil || !r.hint.queued {
			return fmt.Errorf("pod %s is in the hint queue, but its record is not queued", uid)
		}
		if queued[string(uid)] {
			return fmt.Errorf("pod %s is in the hint queue twice", uid)
		}
		queued[string(uid)] = true
	}
	for uid, r := range c.records {
		if r.hint.queued && !queued[string(uid)] {
			return fmt.Errorf("pod %s's hint is queued, but not in the hint queue", uid)
		}
		if r.hint.again && r.call == nil {
			return fmt.Errorf("pod %s's hint waits for a call, none is out", uid)
		}
		if r.call != nil && c.calls[r.call.id] != r.call {
			return fmt.Errorf("pod %s's record holds call %d, which is not out", uid, r.call.id)
		}
	}
	if len(c.hints.order) > c.cfg.budget.queue {
		return fmt.Errorf("%d pods in the hint queue, %d at most", len(c.hints.order), c.cfg.budget.queue)
	}
	return nil
}
