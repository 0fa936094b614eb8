package server

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/journal"
)

var web = map[string]string{"app": "web"}

// Without a cursor: the snapshot (sorted), its end, then live events, each
// with its cursor; from any event's cursor: exactly the events after it.
func TestWatchSnapshotThenEventsThenResume(t *testing.T) {
	h := newHarness(t, journal.Options{}, Config{})
	change(h.j, pod("b", "prod", web, "c"), "ContainerStarted")
	change(h.j, pod("a", "prod", nil, "c"), "ContainerStarted")
	head := h.j.Head().String()

	s := h.watch(t, &lifecyclev1.WatchRequest{})
	got := recvN(t, s, 3)
	if want := []string{"snapshot a", "snapshot b", "snapshot_end"}; !slices.Equal(kinds(got), want) {
		t.Fatalf("got %v, want %v", kinds(got), want)
	}
	for _, m := range got {
		if m.GetCursor() != head {
			t.Fatalf("snapshot message cursor %q, want the head %q", m.GetCursor(), head)
		}
	}
	if c := got[1].GetSnapshot().GetContainers(); len(c) != 1 || c[0].GetId() != "b-c" || c[0].GetState() != lifecyclev1.State_STATE_RUNNING {
		t.Fatalf("snapshot of b: %v", got[1].GetSnapshot())
	}

	code := int32(3)
	died := pod("a", "prod", nil, "c")
	died.Containers[0].State = cruntime.StateExited
	*died.Containers[0] = died.Containers[0].WithStatus(&cruntime.ContainerStatus{State: cruntime.StateExited, ExitCode: code, StartedAt: epoch})
	seq := h.j.Append(journal.Entry{Kind: journal.KindPod, Pod: died, Source: journal.SourceHint,
		Transitions: []journal.Transition{{Type: "ContainerDied", ContainerID: "a-c", ContainerName: "c", ExitCode: &code}}})
	h.j.Append(journal.Entry{Kind: journal.KindRuntime, Runtime: &journal.RuntimeStatus{State: journal.RuntimeUnreachable, Message: "down"}})
	change(h.j, pod("c", "dev", nil), "PodSync")

	ev := recv(t, s)
	e := ev.GetEvent()
	if e == nil || e.GetSource() != lifecyclev1.Source_SOURCE_HINT || len(e.GetTransitions()) != 1 ||
		e.GetTransitions()[0].GetType() != lifecyclev1.EventType_CONTAINER_DIED || e.GetTransitions()[0].GetExitCode() != 3 ||
		e.GetPod().GetContainers()[0].GetExitCode() != 3 || e.GetPod().GetContainers()[0].GetState() != lifecyclev1.State_STATE_EXITED {
		t.Fatalf("event: %v", ev)
	}
	if ev.GetCursor() != fmt.Sprintf("e1-%d", seq) {
		t.Fatalf("event cursor %q, want e1-%d", ev.GetCursor(), seq)
	}
	rest := recvN(t, s, 2)
	if want := []string{"runtime RUNTIME_UNREACHABLE", "event c POD_SYNC"}; !slices.Equal(kinds(rest), want) {
		t.Fatalf("got %v, want %v", kinds(rest), want)
	}
	if rest[0].GetRuntimeStatus().GetMessage() != "down" {
		t.Fatalf("runtime status: %v", rest[0])
	}

	// Resume after the died event: exactly what followed.
	r := h.watch(t, &lifecyclev1.WatchRequest{Cursor: ev.GetCursor()})
	again := recvN(t, r, 2)
	if !slices.Equal(kinds(again), kinds(rest)) || again[1].GetCursor() != rest[1].GetCursor() {
		t.Fatalf("resumed: %v, want %v", kinds(again), kinds(rest))
	}
}

// Filters apply to the snapshot and the events; bad ones, bad fields and
// bad cursors are InvalidArgument naming the bad part.
func TestWatchFiltersAndInvalidArguments(t *testing.T) {
	h := newHarness(t, journal.Options{}, Config{})
	change(h.j, pod("a", "prod", web), "ContainerStarted")
	change(h.j, pod("b", "prod", nil), "ContainerStarted")
	change(h.j, pod("c", "dev", web), "ContainerStarted")

	s := h.watch(t, &lifecyclev1.WatchRequest{Filter: &lifecyclev1.Filter{
		Namespaces: []string{"prod"}, LabelSelector: "app=web", EventTypes: []lifecyclev1.EventType{lifecyclev1.EventType_CONTAINER_DIED}}})
	if got := kinds(recvN(t, s, 2)); !slices.Equal(got, []string{"snapshot a", "snapshot_end"}) {
		t.Fatalf("filtered snapshot: %v", got)
	}
	change(h.j, pod("a", "prod", web), "ContainerStarted") // wrong type
	change(h.j, pod("c", "dev", web), "ContainerDied")     // wrong namespace
	change(h.j, pod("b", "prod", nil), "ContainerDied")    // wrong labels
	change(h.j, pod("a", "prod", web), "PodSync", "ContainerDied")
	if got := kind(recv(t, s)); got != "event a POD_SYNC,CONTAINER_DIED" {
		t.Fatalf("filtered event: %v", got)
	}

	for _, c := range []struct {
		req   *lifecyclev1.WatchRequest
		field string
	}{
		{&lifecyclev1.WatchRequest{Filter: &lifecyclev1.Filter{LabelSelector: "app in (web"}}, "filter.label_selector"},
		{&lifecyclev1.WatchRequest{Filter: &lifecyclev1.Filter{Namespaces: []string{"Not_A_Namespace"}}}, "filter.namespaces"},
		{&lifecyclev1.WatchRequest{Filter: &lifecyclev1.Filter{PodUids: []string{" "}}}, "filter.pod_uids"},
		{&lifecyclev1.WatchRequest{Filter: &lifecyclev1.Filter{EventTypes: []lifecyclev1.EventType{0}}}, "filter.event_types"},
		{&lifecyclev1.WatchRequest{Filter: &lifecyclev1.Filter{EventTypes: []lifecyclev1.EventType{42}}}, "filter.event_types"},
		{&lifecyclev1.WatchRequest{Fields: []string{"identity", "pids"}}, "fields"},
		{&lifecyclev1.WatchRequest{Cursor: "nonsense"}, "cursor"},
		{&lifecyclev1.WatchRequest{Cursor: "e1-x"}, "cursor"},
	} {
		_, err := recvErr(h.watch(t, c.req))
		st := status.Convert(err)
		if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), c.field) && c.field != "cursor" {
			t.Errorf("%v: %v, want InvalidArgument naming %s", c.req, err, c.field)
			continue
		}
		var named string
		for _, d := range st.Details() {
			if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) == 1 {
				named = br.GetFieldViolations()[0].GetField()
			}
		}
		if named != c.field {
			t.Errorf("%v: BadRequest names %q, want %q (%v)", c.req, named, c.field, err)
		}
	}
	// ListPods takes the same filters.
	_, err := h.client.ListPods(context.Background(), &lifecyclev1.ListPodsRequest{Filter: &lifecyclev1.Filter{LabelSelector: "=="}})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "filter.label_selector") {
		t.Fatalf("ListPods with a bad selector: %v", err)
	}
}

// A cursor that cannot be resumed from gets one resync_required, then the
// stream ends OK; each is counted by reason.
func TestWatchResyncRequired(t *testing.T) {
	h := newHarness(t, journal.Options{Size: 2}, Config{})
	for range 4 {
		change(h.j, pod("a", "prod", nil), "PodSync")
	}
	for _, c := range []struct{ cursor, reason, label string }{
		{"other-1", journal.ReasonOtherEpoch, "other_epoch"},
		{"e1-0", journal.ReasonTooOld, "too_old"},
		{"e1-99", journal.ReasonFutureEvent, "future_cursor"},
	} {
		got, err := recvErr(h.watch(t, &lifecyclev1.WatchRequest{Cursor: c.cursor}))
		if !isEOF(err) || len(got) != 1 || got[0].GetResyncRequired().GetReason() != c.reason {
			t.Fatalf("cursor %s: %v then %v, want one resync_required (%s) then OK", c.cursor, kinds(got), err, c.reason)
		}
		if n := testutil.ToFloat64(h.srv.m.resyncs.WithLabelValues(c.label)); n != 1 {
			t.Fatalf("resyncs{%s} = %v, want 1", c.label, n)
		}
	}
}

// Lookups: ListPods with its cursor, a pod by UID, a container or sandbox
// by ID, current or removed, NotFound otherwise.
func TestLookups(t *testing.T) {
	h := newHarness(t, journal.Options{}, Config{})
	ctx := context.Background()
	change(h.j, pod("a", "prod", web, "c1", "c2"), "ContainerStarted")
	change(h.j, pod("b", "dev", nil, "c"), "ContainerStarted")
	change(h.j, pod("a", "prod", web, "c1"), "ContainerRemoved")
	h.jclock.Step(time.Second)
	gone := pod("b", "dev", nil)
	gone.Gone, gone.Sandboxes = true, nil
	change(h.j, gone, "ContainerRemoved")

	list, err := h.client.ListPods(ctx, &lifecyclev1.ListPodsRequest{})
	if err != nil || list.GetCursor() != h.j.Head().String() || len(list.GetPods()) != 1 || list.GetPods()[0].GetUid() != "a" {
		t.Fatalf("ListPods: %v %v", list, err)
	}
	if l, _ := h.client.ListPods(ctx, &lifecyclev1.ListPodsRequest{Filter: &lifecyclev1.Filter{Namespaces: []string{"dev"}}}); len(l.GetPods()) != 0 {
		t.Fatalf("ListPods of dev: %v", l)
	}
	p, err := h.client.GetPod(ctx, &lifecyclev1.GetPodRequest{Uid: "a"})
	if err != nil || len(p.GetContainers()) != 1 || p.GetLabels()["app"] != "web" {
		t.Fatalf("GetPod a: %v %v", p, err)
	}
	for uid, want := range map[string]codes.Code{"b": codes.NotFound, "": codes.InvalidArgument} {
		if _, err := h.client.GetPod(ctx, &lifecyclev1.GetPodRequest{Uid: uid}); status.Code(err) != want {
			t.Fatalf("GetPod %q: %v, want %v", uid, err, want)
		}
	}
	c, err := h.client.GetContainer(ctx, &lifecyclev1.GetContainerRequest{Id: "a-c1"})
	if err != nil || c.GetRemoved() || c.GetContainer().GetName() != "c1" || c.GetPod().GetUid() != "a" {
		t.Fatalf("GetContainer a-c1: %v %v", c, err)
	}
	c, err = h.client.GetContainer(ctx, &lifecyclev1.GetContainerRequest{Id: "a-c2"})
	if err != nil || !c.GetRemoved() || c.GetContainer().GetName() != "c2" || !c.GetRemovedAt().AsTime().Equal(epoch) {
		t.Fatalf("GetContainer a-c2 (removed): %v %v", c, err)
	}
	c, err = h.client.GetContainer(ctx, &lifecyclev1.GetContainerRequest{Id: "b-sb"})
	if err != nil || !c.GetRemoved() || c.GetSandbox().GetId() != "b-sb" || c.GetContainer() != nil ||
		!c.GetRemovedAt().AsTime().Equal(epoch.Add(time.Second)) || c.GetPod().GetNamespace() != "dev" {
		t.Fatalf("GetContainer b-sb (removed with its pod): %v %v", c, err)
	}
	for id, want := range map[string]codes.Code{"nope": codes.NotFound, "": codes.InvalidArgument} {
		if _, err := h.client.GetContainer(ctx, &lifecyclev1.GetContainerRequest{Id: id}); status.Code(err) != want {
			t.Fatalf("GetContainer %q: %v, want %v", id, err, want)
		}
	}
	hc, err := healthpb.NewHealthClient(h.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "pleg.lifecycle.v1.Lifecycle"})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", hc, err)
	}
	// Reflection lists the services, for generic clients (grpcurl).
	rs, err := reflectionpb.NewServerReflectionClient(h.conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	lr, err := rs.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var services []string
	for _, sv := range lr.GetListServicesResponse().GetService() {
		services = append(services, sv.GetName())
	}
	if !slices.Contains(services, "pleg.lifecycle.v1.Lifecycle") {
		t.Fatalf("reflection lists %v", services)
	}
	_ = rs.CloseSend()
}

// Identities: only a watcher that asks gets them, and the journal knows
// one is open while it is.
func TestIdentityField(t *testing.T) {
	h := newHarness(t, journal.Options{}, Config{})
	p := pod("a", "prod", nil, "c")
	p.Containers[0].Identity = &journal.Identity{PID: 4242, CgroupPath: "/kubepods/a/c"}
	change(h.j, p, "ContainerStarted")

	plain := h.watch(t, &lifecyclev1.WatchRequest{})
	if m := recv(t, plain); m.GetSnapshot().GetContainers()[0].GetIdentity() != nil {
		t.Fatalf("identity sent unasked: %v", m)
	}
	if h.j.IdentityWanted() {
		t.Fatal("identity wanted with no watcher asking")
	}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := h.client.Watch(ctx, &lifecyclev1.WatchRequest{Fields: []string{"identity"}})
	if err != nil {
		t.Fatal(err)
	}
	m := recv(t, s)
	if id := m.GetSnapshot().GetContainers()[0].GetIdentity(); id.GetPid() != 4242 || id.GetCgroupPath() != "/kubepods/a/c" {
		t.Fatalf("identity: %v", m)
	}
	if !h.j.IdentityWanted() {
		t.Fatal("identity not wanted while a watcher asks")
	}
	// An event, encoded once for each choice: the plain watcher's has no
	// identity, the other's has it.
	recv(t, plain) // snapshot_end
	recv(t, s)
	change(h.j, p, "PodSync")
	if m := recv(t, s); m.GetEvent().GetPod().GetContainers()[0].GetIdentity().GetPid() != 4242 {
		t.Fatalf("identity watcher's event: %v", m)
	}
	if m := recv(t, plain); m.GetEvent() == nil || m.GetEvent().GetPod().GetContainers()[0].GetIdentity() != nil {
		t.Fatalf("plain watcher's event: %v", m)
	}
	cancel()
	_, _ = recvErr(s)
	// Once Serve returns, every handler has (and closed its journal
	// watcher).
	h.shutdown(t)
	if h.j.IdentityWanted() {
		t.Fatal("identity still wanted after the watcher left")
	}
}

// A client that stops reading is cut after the stall timeout with
// ResourceExhausted naming its cursor, while another watcher gets every
// event at once; it then resumes from its last cursor with no gap and no
// duplicate. Metrics count the watchers, the lag and the cut.
func TestSlowWatcherIsCutAndResumes(t *testing.T) {
	h := newHarness(t, journal.Options{Size: 1 << 20, MaxBytes: 1 << 30}, Config{QueueSize: 4})
	// Windows of 64 KiB: gRPC's flow control stops the sender soon.
	_, slowClient := h.dial(t, grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	slow, err := slowClient.Watch(ctx, &lifecyclev1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	fast := h.watch(t, &lifecyclev1.WatchRequest{})
	recvN(t, fast, 1) // snapshot_end
	recvN(t, slow, 1)

	// 2,000 events of ~2 KiB: far more than the socket and gRPC buffers.
	big := pod("a", "prod", nil, "c")
	big.Annotations = cruntime.LabelsOf("blob", strings.Repeat("x", 2048))
	const n = 2000
	for range n {
		change(h.j, big, "PodSync")
	}
	for i := range n {
		if m := recv(t, fast); m.GetEvent() == nil {
			t.Fatalf("fast watcher message %d: %v", i, kind(m))
		}
	}
	if w, l := h.srv.watchStats(); w != 2 || l == 0 {
		t.Fatalf("watchers %d, max lag %d; want 2 and > 0", w, l)
	}
	// Let each stall timer expire (the fast watch's find it reading)
	// until the slow watch is cut.
	stepUntilCut(t, h, "the slow watcher")

	got, err := recvErr(slow)
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "did not read for 10s") {
		t.Fatalf("slow watcher ended with %v, want ResourceExhausted", err)
	}
	// The cut names the last message the watch knows it handed to the
	// connection. Messages whose send was still waiting for the client's
	// flow control when the watch decided to cut (one in flight and the
	// queue's QueueSize) may reach the client before the status, when it
	// starts reading in between: the cursor is then behind the last one
	// received, never ahead of it (that would be a gap), and the message
	// says to resume from a later one received (docs/stream.md).
	last := got[len(got)-1].GetCursor()
	lastC, _ := journal.ParseCursor(last)
	r, named := errorInfo(err)
	namedC, perr := journal.ParseCursor(named)
	if r != lifecyclev1.ReasonNotReading || perr != nil {
		t.Fatalf("cut's ErrorInfo: reason %q cursor %q (%v), want %q and a cursor", r, named, perr, lifecyclev1.ReasonNotReading)
	}
	if namedC.Seq > lastC.Seq || lastC.Seq-namedC.Seq > 4+1 {
		t.Fatalf("the cut names cursor %s; the client received up to %s: want at most QueueSize+1 = 5 behind, never ahead", named, last)
	}
	if !strings.Contains(st.Message(), "resume with cursor "+named+" (or a later one you received)") {
		t.Fatalf("cut message %q does not name its cursor %s and the later ones", st.Message(), named)
	}
	t.Logf("the cut named %s; the client had received up to %s", named, last)
	if c := testutil.ToFloat64(h.srv.m.cuts.WithLabelValues(CutNotReading)); c != 1 {
		t.Fatalf("cuts = %v, want 1", c)
	}
	if !strings.Contains(h.logs.Find("Cut a watcher"), "uid=") {
		t.Fatalf("the cut's log line does not name the peer: %q", h.logs.Find("Cut a watcher"))
	}
	// Resume: the events after the last one received, exactly.
	resumed := h.watch(t, &lifecyclev1.WatchRequest{Cursor: last})
	c, _ := journal.ParseCursor(last)
	for want := c.Seq + 1; want <= h.j.Head().Seq; want++ {
		m := recv(t, resumed)
		if m.GetCursor() != fmt.Sprintf("e1-%d", want) {
			t.Fatalf("resumed at %s: got %s, want e1-%d", last, m.GetCursor(), want)
		}
	}
	if received := len(got) + int(h.j.Head().Seq-c.Seq); received != n {
		t.Fatalf("%d events received across the cut, want %d", received, n)
	}
}

// A watcher that stops reading is cut once a message has waited for it
// for the stall timeout, however short its queue: on a quiet node a few
// large events fill the connection's flow-control window and leave the
// watch's queue of 64 nearly empty (it was never cut before the watch used
// internal/outbox's rule: only a full queue started its stall timer).
func TestStoppedWatcherCutWithQueueNotFull(t *testing.T) {
	h := newHarness(t, journal.Options{Size: 1 << 20, MaxBytes: 1 << 30}, Config{})
	_, slowClient := h.dial(t, grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	slow, err := slowClient.Watch(ctx, &lifecyclev1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recvN(t, slow, 1) // snapshot_end
	// Eight events of ~256 KiB: more than the window, gRPC's write quota
	// and the socket's buffers take, far fewer than the queue holds.
	big := pod("a", "prod", nil, "c")
	big.Annotations = cruntime.LabelsOf("blob", strings.Repeat("x", 256<<10))
	for range 8 {
		change(h.j, big, "PodSync")
	}
	stepUntilCut(t, h, "the watcher that stopped reading")
	got, err := recvErr(slow)
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "did not read for 10s") {
		t.Fatalf("the stopped watcher ended with %v, want ResourceExhausted", err)
	}
	if len(got) >= 8 {
		t.Fatalf("received %d of 8 events before the cut: it was not blocked", len(got))
	}
	if w, _ := h.srv.watchStats(); w != 0 {
		t.Fatalf("%d watches open after the cut", w)
	}
}

// Shutdown ends every watch with Unavailable naming its cursor; Serve
// returns nil and leaves nothing running (TestMain checks).
func TestShutdownEndsWatches(t *testing.T) {
	h := newHarness(t, journal.Options{}, Config{})
	s := h.watch(t, &lifecyclev1.WatchRequest{})
	end := recv(t, s)
	h.shutdown(t)
	_, err := recvErr(s)
	if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), end.GetCursor()) {
		t.Fatalf("after shutdown: %v, want Unavailable naming %s", err, end.GetCursor())
	}
	if r, c := errorInfo(err); r != lifecyclev1.ReasonShuttingDown || c != end.GetCursor() {
		t.Fatalf("shutdown's ErrorInfo: %q %q", r, c)
	}
	if _, err := os.Stat(h.sock); !os.IsNotExist(err) {
		t.Fatalf("socket left behind: %v", err)
	}
}

// Watches beyond MaxWatchers get ResourceExhausted; an idle watch gets
// bookmarks that move its cursor on.
func TestMaxWatchersAndBookmarks(t *testing.T) {
	h := newHarness(t, journal.Options{BookmarkInterval: time.Minute}, Config{MaxWatchers: 1})
	s := h.watch(t, &lifecyclev1.WatchRequest{Filter: &lifecyclev1.Filter{Namespaces: []string{"prod"}}})
	recv(t, s)
	_, err := recvErr(h.watch(t, &lifecyclev1.WatchRequest{}))
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "too many watchers") {
		t.Fatalf("second watch: %v", err)
	}
	waitTimer(t, h.jclock)                       // the watch waits for the journal
	change(h.j, pod("x", "dev", nil), "PodSync") // filtered out
	h.jclock.Step(time.Minute)
	if m := recv(t, s); kind(m) != "bookmark" || m.GetCursor() != h.j.Head().String() {
		t.Fatalf("idle watch: %v at %s, want a bookmark at %s", kind(m), m.GetCursor(), h.j.Head())
	}
}

// Peer credentials: logged; with allowed lists, a peer outside them is
// refused and counted. TCP cannot be restricted.
func TestPeerCredentials(t *testing.T) {
	uid, gid := uint32(os.Getuid()), uint32(os.Getgid())
	h := newHarness(t, journal.Options{}, Config{Access: Access{AllowedUIDs: []uint32{uid}}})
	if _, err := h.client.ListPods(context.Background(), &lifecyclev1.ListPodsRequest{}); err != nil {
		t.Fatal(err)
	}
	line := h.logs.Find("Lifecycle API client connected")
	if want := fmt.Sprintf(`"uid"=%d "gid"=%d "pid"=%d`, uid, gid, os.Getpid()); !strings.Contains(line, want) {
		t.Fatalf("connection log %q lacks %s", line, want)
	}

	other := newHarness(t, journal.Options{}, Config{Access: Access{AllowedUIDs: []uint32{uid + 1}, AllowedGIDs: []uint32{gid + 1}}})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	_, err := other.client.ListPods(ctx, &lifecyclev1.ListPodsRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("refused peer: %v, want Unavailable", err)
	}
	if n := testutil.ToFloat64(other.srv.m.rejected); n < 1 {
		t.Fatalf("rejected = %v", n)
	}
	if !strings.Contains(other.logs.Find("Refused a lifecycle API client"), fmt.Sprintf("uid=%d", uid)) {
		t.Fatal("refusal not logged with the peer's UID")
	}

	srv, _ := New(Config{Journal: journal.New(journal.Options{}), Access: Access{AllowedGIDs: []uint32{0}}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(context.Background(), ln); err == nil || !strings.Contains(err.Error(), "no credentials") {
		t.Fatalf("TCP with allowed GIDs: %v", err)
	}
}

// ListenUnix: mode and group set, a stale socket replaced, a live one or a
// file refused, the socket removed on Close.
func TestListenUnix(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "pleg")
	path := filepath.Join(dir, "pleg.sock")
	ln, err := ListenUnix(path, 0o640, os.Getgid())
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o640 || fi.Sys().(*syscall.Stat_t).Gid != uint32(os.Getgid()) {
		t.Fatalf("socket %v %v", fi, err)
	}
	if _, err := ListenUnix(path, 0o600, -1); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second listener on a live socket: %v", err)
	}
	ln.Close()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("Close left the socket: %v", err)
	}
	// A stale socket (its listener gone without removing it) is replaced.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	ln, err = ListenUnix(path, 0o600, -1)
	if err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}
	ln.Close()
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ListenUnix(path, 0o600, -1); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("over a regular file: %v", err)
	}
}

// The metrics are registered with their names; a watcher's lag counts
// from where it started.
func TestMetrics(t *testing.T) {
	h := newHarness(t, journal.Options{}, Config{})
	change(h.j, pod("a", "prod", nil), "PodSync")
	change(h.j, pod("a", "prod", nil), "PodSync")
	h.watch(t, &lifecyclev1.WatchRequest{Cursor: h.j.Head().String()})
	waitTimer(t, h.jclock) // it waits for the journal: nothing to send
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			got[mf.GetName()] = m.GetGauge().GetValue()
		}
	}
	for name, want := range map[string]float64{"pleg_lifecycle_watchers": 1, "pleg_lifecycle_watcher_max_lag_entries": 0} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %v (registered: %v), want %v", name, v, ok, want)
		}
	}
	change(h.j, pod("a", "prod", nil), "PodSync")
	if _, lag := h.srv.watchStats(); lag > 1 {
		t.Errorf("lag %d after one append, want at most 1", lag)
	}
}

// errorInfo returns the reason and cursor of a status's ErrorInfo.
func errorInfo(err error) (reason, cursor string) {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == lifecyclev1.ErrorDomain {
			return info.GetReason(), info.GetMetadata()[lifecyclev1.MetadataCursor]
		}
	}
	return "", ""
}

// A connection left open without a call is closed after the idle timeout,
// freeing its slot: with one slot, a second client gets in once the first
// client's connection has idled out.
func TestIdleConnectionFreesItsSlot(t *testing.T) {
	h := newHarness(t, journal.Options{}, Config{MaxConnections: 1, IdleTimeout: 100 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if _, err := h.client.ListPods(ctx, &lifecyclev1.ListPodsRequest{}); err != nil {
		t.Fatal(err)
	}
	_, second := h.dial(t)
	if _, err := second.ListPods(ctx, &lifecyclev1.ListPodsRequest{}); err != nil {
		t.Fatalf("a second connection, once the first idled out: %v", err)
	}
}

// An error echoes a client's value bounded: a 40,000-byte cursor, label
// selector, namespace, field or ID gets an error whose status (the
// grpc-message and grpc-status-details-bin trailers) stays small, where
// echoing the whole value twice made a trailer over Node's 64 KiB header
// limit and wedged the client's connection.
func TestErrorsEchoValuesBounded(t *testing.T) {
	h := newHarness(t, journal.Options{}, Config{})
	long := strings.Repeat("x", 40000)
	const maxStatus = 2048 // bytes of the whole status, details included
	check := func(what string, err error, want codes.Code) {
		t.Helper()
		st := status.Convert(err)
		if st.Code() != want {
			t.Errorf("%s: %v, want %v", what, st.Code(), want)
		}
		if n := proto.Size(st.Proto()); n > maxStatus {
			t.Errorf("%s: the status is %d bytes (message %d), want at most %d", what, n, len(st.Message()), maxStatus)
		}
		if !strings.Contains(st.Message(), "... (400") {
			t.Errorf("%s: the message does not say the value's length: %.200s", what, st.Message())
		}
	}
	for what, req := range map[string]*lifecyclev1.WatchRequest{
		"cursor":         {Cursor: long},
		"cursor (epoch)": {Cursor: long + "-x"},
		"label selector": {Filter: &lifecyclev1.Filter{LabelSelector: "app in (" + long}},
		"label value":    {Filter: &lifecyclev1.Filter{LabelSelector: "app=" + long}},
		"namespace":      {Filter: &lifecyclev1.Filter{Namespaces: []string{long}}},
		"fields":         {Fields: []string{long}},
	} {
		_, err := recvErr(h.watch(t, req))
		check("Watch "+what, err, codes.InvalidArgument)
	}
	_, err := h.client.ListPods(context.Background(), &lifecyclev1.ListPodsRequest{Filter: &lifecyclev1.Filter{LabelSelector: "app in (" + long}})
	check("ListPods label selector", err, codes.InvalidArgument)
	_, err = h.client.GetPod(context.Background(), &lifecyclev1.GetPodRequest{Uid: long})
	check("GetPod", err, codes.NotFound)
	_, err = h.client.GetContainer(context.Background(), &lifecyclev1.GetContainerRequest{Id: long})
	check("GetContainer", err, codes.NotFound)
}

// A request that is not a valid message is INVALID_ARGUMENT, as the docs'
// table says (gRPC's own answer to a codec error is INTERNAL), for the
// unary calls and for Watch; the connection serves on.
func TestUndecodableRequestInvalidArgument(t *testing.T) {
	h := newHarness(t, journal.Options{}, Config{})
	garbage := &bytesFrame{b: []byte{0x0a, 0xff, 0xff}} // field 1, a length past the end
	ctx := context.Background()
	for _, method := range []string{lifecyclev1.Lifecycle_ListPods_FullMethodName, lifecyclev1.Lifecycle_GetPod_FullMethodName, lifecyclev1.Lifecycle_GetContainer_FullMethodName} {
		err := h.conn.Invoke(ctx, method, garbage, &bytesFrame{}, grpc.ForceCodecV2(bytesCodec{}))
		if st := status.Convert(err); st.Code() != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", method, err)
		}
	}
	s, err := h.conn.NewStream(ctx, &lifecyclev1.Lifecycle_ServiceDesc.Streams[0], lifecyclev1.Lifecycle_Watch_FullMethodName, grpc.ForceCodecV2(bytesCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SendMsg(garbage); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if err := s.RecvMsg(&bytesFrame{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Watch: %v, want InvalidArgument", err)
	}
	if _, err := h.client.ListPods(ctx, &lifecyclev1.ListPodsRequest{}); err != nil {
		t.Fatalf("a valid request after: %v", err)
	}
}

// bytesFrame is a message sent and received as raw bytes (bytesCodec).
type bytesFrame struct{ b []byte }

type bytesCodec struct{}

func (bytesCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(*bytesFrame).b)}, nil
}

func (bytesCodec) Unmarshal(data mem.BufferSlice, v any) error {
	v.(*bytesFrame).b = data.Materialize()
	return nil
}

func (bytesCodec) Name() string { return "proto" }
