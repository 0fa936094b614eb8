package pleg

import (
	"context"
	"time"

	"github.com/podlifecycle/pleg/journal"
)

// The loop is the one goroutine that owns the core: it feeds it time, the
// pool's results and what other goroutines put in the inbox, and carries
// out what comes out. It holds no rule of its own. What other goroutines
// read (health, the running relist, recent relists, the cache, the
// subscriptions) is what the loop publishes.

// run is the loop of a started generator, until ctx ends.
func (g *Generator) run(ctx context.Context) {
	g.step(tick{}) // the first relist is immediate
	var batch []input
	for ctx.Err() == nil {
		batch = g.next(ctx, batch[:0])
		for i, in := range batch {
			g.step(in)
			batch[i] = nil
		}
	}
}

// next waits for what happens next and returns it as inputs: a tick when
// the core's wake time has come (after the results of the calls that
// returned by then: a call that returned is never taken for one out),
// the calls' results, or what the inbox holds. It returns none when ctx
// ends.
func (g *Generator) next(ctx context.Context, into []input) []input {
	now := g.clock.Now()
	wake := g.core.Wake()
	if !wake.IsZero() && !now.Before(wake) {
		return g.tick(into)
	}
	var timeout <-chan time.Time
	if !wake.IsZero() {
		t := g.clock.NewTimer(wake.Sub(now))
		defer t.Stop()
		timeout = t.C()
	}
	select {
	case <-ctx.Done():
		return into
	case <-timeout:
		return g.tick(into)
	case <-g.pool.ready:
		into, _ = g.pool.collect(into, false)
		return into
	case <-g.inbox.wake:
		return g.take(into)
	}
}

// tick returns the results collected so far, then a tick with the
// progress of the calls still out. With the adaptive relist on, what the
// inbox holds comes first, so that the core knows how far it is caught up
// (taken).
func (g *Generator) tick(into []input) []input {
	into, waiting := g.pool.collect(into, true)
	if g.opts.adaptive() {
		into = g.take(into)
	}
	return append(into, tick{waiting: waiting})
}

// take returns what the inbox holds; with the adaptive relist on, then a
// taken input stamped before the take.
func (g *Generator) take(into []input) []input {
	if !g.opts.adaptive() {
		return g.inbox.take(into)
	}
	at := g.clock.Now()
	into = g.inbox.take(into)
	return append(into, taken{at: at, waiters: g.cache.Waiters()})
}

// step steps the core with in at the clock's time and carries out the
// effects.
func (g *Generator) step(in input) {
	now := g.clock.Now()
	g.logs.now = now
	rd := g.core.Step(now, in)
	for _, req := range rd.Calls {
		g.pool.start(req)
	}
	for _, op := range rd.Cache {
		switch op.kind {
		case cacheSet:
			g.cache.Set(op.uid, op.status, op.err, op.at)
		case cacheDelete:
			g.cache.Delete(op.uid)
		case cacheObserved:
			g.cache.MarkObserved(op.uid, op.at)
		case cacheTime:
			g.cache.UpdateTime(op.at, op.held...)
		}
	}
	for _, p := range rd.Publish {
		g.journal.Append(journalEntry(p, now))
		if !p.update {
			g.deliver.publish(p.events)
		}
	}
	if r := rd.Runtime; r != nil {
		g.journal.Append(journal.Entry{Kind: journal.KindRuntime, Time: now, Runtime: r})
	}
	g.observe(rd, now)
	for _, n := range rd.Notes {
		g.report(n)
	}
	if !rd.Healthy.IsZero() {
		g.lastRelist.Store(rd.Healthy.UnixNano())
		g.m.LastSeen.Set(float64(rd.Healthy.Unix()))
	}
	if !rd.RelistStarted.IsZero() {
		g.relistRunningSince.Store(rd.RelistStarted.UnixNano())
		g.log.V(5).Info("GenericPLEG: Relisting")
	}
	if s := rd.Relist; s != nil {
		g.relistRunningSince.Store(0)
		g.nextPeriod.Store(int64(s.NextPeriod))
		g.m.RelistDuration.Observe(s.Duration.Seconds())
		g.stats.add(*s)
		g.lastStat = *s
	}
	g.abandoned.Store(int64(rd.Abandoned))
	g.logs.flush(now)
}

// Relist runs one global relist on the calling goroutine and returns the
// listing error, if any; then it runs the single-pod relists requested so
// far as far as the hint budget allows. It is for generators that are
// driven by hand (benchmarks, tools, tests) and fails if Start was called.
// Relist calls are serialized; Stop does not wait for one's runtime calls:
// it ends them, and the Relist returns an error.
func (g *Generator) Relist(ctx context.Context) error {
	g.manual.Lock()
	defer g.manual.Unlock()
	g.lifecycle.Lock()
	if g.started {
		g.lifecycle.Unlock()
		return errRelistStarted
	}
	if g.rootCtx.Err() != nil {
		g.lifecycle.Unlock()
		return errRelistStopped
	}
	// Stop waits for this relist (wg) but does not wait for the lock
	// across its runtime calls: it cancels the generator's context,
	// which ends the calls and the wait below.
	g.wg.Add(1)
	g.lifecycle.Unlock()
	defer g.wg.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(g.rootCtx, cancel)()
	g.lastStat = RelistStat{}
	g.step(relistNow{})
	var batch []input
	for {
		batch = g.inbox.take(batch[:0])
		for _, in := range batch {
			g.step(in)
		}
		if g.core.Settled() && len(batch) == 0 {
			if g.lastStat.err != nil && g.rootCtx.Err() != nil {
				// The listing failed because Stop ended its call.
				return errStoppedInRelist
			}
			return g.lastStat.err
		}
		batch = g.next(ctx, batch[:0])
		if ctx.Err() != nil {
			if g.rootCtx.Err() != nil {
				return errStoppedInRelist
			}
			return ctx.Err()
		}
		for _, in := range batch {
			g.step(in)
		}
	}
}
