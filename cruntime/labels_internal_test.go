package cruntime

import (
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// Sets with the same keys share them; a set of other keys has its own;
// past the table's bound a new key set is kept privately, and still
// answers as its map. Labels made without an Interner keep their own.
func TestLabelsShareKeys(t *testing.T) {
	const bound = 64
	in := NewInterner(InternLimits{MaxEntries: bound})
	pod := func(uid, name string) map[string]string {
		return map[string]string{LabelPodUID: uid, LabelPodName: name, LabelPodNamespace: "default", LabelContainerName: "app"}
	}
	a, b := in.Labels(pod("u1", "web-0")), in.Labels(pod("u2", "web-1"))
	if a.keys != b.keys {
		t.Error("two sets of the kubelet's container label keys keep two key slices")
	}
	if a.Equal(b) || a.Get(LabelPodUID) != "u1" || b.Get(LabelPodUID) != "u2" {
		t.Errorf("sets sharing keys mixed up: %v, %v", a, b)
	}
	if c := in.Labels(map[string]string{"app": "web"}); c.keys == a.keys {
		t.Error("sets of different keys share keys")
	}
	// {"ab"} and {"a", "b"} are different key sets.
	x, y := in.Labels(map[string]string{"ab": "1"}), in.Labels(map[string]string{"a": "1", "b": "2"})
	if x.keys == y.keys || x.Get("ab") != "1" || y.Get("b") != "2" {
		t.Errorf("key sets mixed up: %v, %v", x, y)
	}
	if p, q := NewLabels(pod("u1", "web-0")), NewLabels(pod("u1", "web-0")); p.keys == q.keys || p.keys == a.keys || !p.Equal(a) {
		t.Error("labels made without an Interner share their keys")
	}

	for i := 0; in.Stats().Entries < bound; i++ {
		in.Labels(map[string]string{"k" + strconv.Itoa(i): "v"})
	}
	p, q := in.Labels(map[string]string{"late": "1"}), in.Labels(map[string]string{"late": "2"})
	if n := in.Stats().Entries; n != bound || p.keys == q.keys || p.Get("late") != "1" || q.Get("late") != "2" {
		t.Errorf("past the bound: %d entries, %v and %v", n, p, q)
	}
	if again := in.Labels(pod("u3", "web-2")); again.keys != a.keys {
		t.Error("a key set shared before the table filled is no longer shared")
	}
	long := in.Labels(map[string]string{strings.Repeat("k", maxKeySetBytes): "v"})
	if long.Len() != 1 || long.Get(strings.Repeat("k", maxKeySetBytes)) != "v" {
		t.Errorf("a key longer than the content key bound: %v", long.Len())
	}
}

func TestImageRefsIntern(t *testing.T) {
	in := NewInterner(InternLimits{MaxEntries: 100})
	ref := "sha256:" + strings.Repeat("ab", 32)
	a, b := in.String(strings.Clone(ref)), in.String(strings.Clone(ref))
	if unsafe.StringData(a) != unsafe.StringData(b) {
		t.Error("the same reference was kept twice")
	}
	for i := range 110 {
		in.String(fmt.Sprint("sha256:ref-", i, strings.Repeat("0", 20)))
	}
	if n := in.Stats().Entries; n > 100 {
		t.Errorf("%d references interned, bound 100", n)
	}
	if in.String("") != "" {
		t.Error("empty reference")
	}
}

// Two containers' labels with the same keys and values keep one copy of
// each string of internMin bytes or more, and the same entries.
func TestLabelsShareStrings(t *testing.T) {
	in := new(Interner)
	decoded := func(restarts string) map[string]string {
		return map[string]string{
			strings.Clone("io.kubernetes.container.terminationMessagePath"): strings.Clone("/dev/termination-log"),
			strings.Clone("io.kubernetes.container.restartCount"):           strings.Clone(restarts),
		}
	}
	// Sets that differ by one value: the strings are shared even where
	// the sets are not.
	a, b := in.Labels(decoded("0")), in.Labels(decoded("1"))
	if !maps.Equal(a.Map(), decoded("0")) || !maps.Equal(b.Map(), decoded("1")) {
		t.Fatalf("labels changed: %v, %v", a, b)
	}
	if a.SameAs(b) {
		t.Fatal("two different sets shared")
	}
	for i, v := range a.vals {
		if k, kb := a.key(i), b.key(i); unsafe.StringData(k) != unsafe.StringData(kb) {
			t.Errorf("key %q kept twice", k)
		}
		if len(v) >= internMin && unsafe.StringData(v) != unsafe.StringData(b.vals[i]) {
			t.Errorf("value %q kept twice", v)
		}
	}
	if l := in.Labels(nil); l.Len() != 0 {
		t.Errorf("nil labels became %v", l)
	}
}

// Equal label maps are one set; maps that differ by one value, or whose
// entries' bytes run together the same way, are not; the table stays
// within its bound, and a map too large to share is kept as is.
func TestLabelsShareMaps(t *testing.T) {
	const bound = 256
	in := NewInterner(InternLimits{MaxEntries: bound})
	ann := func(restarts string) map[string]string {
		return map[string]string{
			strings.Clone("io.kubernetes.container.hash"):         strings.Clone("5d1e2c3b"),
			strings.Clone("io.kubernetes.container.restartCount"): strings.Clone(restarts),
		}
	}
	a, b, c := in.Labels(ann("0")), in.Labels(ann("0")), in.Labels(ann("1"))
	if !a.SameAs(b) {
		t.Error("two equal sets kept twice")
	}
	if a.SameAs(c) || c.Get("io.kubernetes.container.restartCount") != "1" {
		t.Errorf("maps that differ shared: %v", c)
	}
	// {"ab": "c"} and {"a": "bc"} run together as "abc".
	x, y := in.Labels(map[string]string{"ab": "c"}), in.Labels(map[string]string{"a": "bc"})
	if !maps.Equal(x.Map(), map[string]string{"ab": "c"}) || !maps.Equal(y.Map(), map[string]string{"a": "bc"}) {
		t.Errorf("maps mixed up: %v, %v", x, y)
	}
	for i := range 3 * bound {
		in.Labels(map[string]string{"k": strconv.Itoa(i)})
		if n := in.Stats().Entries; n > bound {
			t.Fatalf("%d entries, bound %d", n, bound)
		}
	}
	big := func() map[string]string { return map[string]string{"k": strings.Repeat("v", maxSetBytes)} }
	if p, q := in.Labels(big()), in.Labels(big()); p.SameAs(q) {
		t.Error("a map beyond maxSetBytes shared")
	}
	// A huge annotation (a last-applied-configuration) is not copied into
	// the table's scratch key, which would keep its size for good.
	in.Labels(map[string]string{"a": "1", "last-applied": strings.Repeat("x", 200<<10)})
	if c := cap(in.buf); c > 2*maxSetBytes {
		t.Errorf("the scratch key grew to %d bytes for a set it does not share", c)
	}
}

// A set that names its pod (a container's or sandbox's labels) is that
// pod's alone: it is not shared, and a node's worth of them does not
// crowd out the sets its replicas do share.
func TestLabelsNamingAPodNotShared(t *testing.T) {
	in := new(Interner)
	ann := func() map[string]string {
		return map[string]string{strings.Clone("io.kubernetes.container.hash"): strings.Clone("5d1e2c3b")}
	}
	own := func(i int) map[string]string {
		return map[string]string{LabelPodUID: "uid-" + strconv.Itoa(i/10), LabelContainerName: "c" + strconv.Itoa(i%10)}
	}
	first := in.Labels(ann())
	for i := range 3*1024 + 7 {
		if l := in.Labels(own(i)); l.Get(LabelPodUID) != "uid-"+strconv.Itoa(i/10) {
			t.Fatalf("labels %v", l)
		}
	}
	if n := len(in.sets); n != 1 {
		t.Errorf("%d sets in the table, want 1 (the annotations): a pod's own labels were added", n)
	}
	if again := in.Labels(ann()); !again.SameAs(first) {
		t.Error("the replicas' annotations are kept twice")
	}
}

// Pods replaced one after another, each with values of its own: the
// table keeps what the pods of the last rounds use, not what dead pods
// used; a value longer than MaxLen is never kept; what live pods use
// again survives every sweep, and stays shared.
func TestInternerLetsGoOfTheDead(t *testing.T) {
	in := NewInterner(InternLimits{SweepBytes: 4 << 10})
	shared := map[string]string{"kubernetes.io/config.source": "api", "app.kubernetes.io/name": "web-frontend-service"}
	sandbox := func(i int) map[string]string {
		return map[string]string{
			"kubernetes.io/config.seen":         fmt.Sprintf("2026-11-29T10:%02d:%02d.%09dZ", i/60%60, i%60, i),
			"k8s.v1.cni.cncf.io/network-status": fmt.Sprintf("[{%q: %d}]", strings.Repeat("n", 4<<10), i),
			LabelPodUID:                         fmt.Sprintf("0b6f7c1e-4d2a-4f3b-9c8d-%012d", i),
		}
	}
	first := in.Labels(shared)
	maxBytes := 0
	for i := range 2000 {
		in.Labels(sandbox(i))
		if again := in.Labels(shared); !again.SameAs(first) {
			t.Fatalf("pod %d: the replicas' set was dropped while in use", i)
		}
		in.Round()
		maxBytes = max(maxBytes, in.Stats().Bytes)
	}
	st := in.Stats()
	if st.Sweeps == 0 {
		t.Fatal("2,000 pods replaced and no sweep")
	}
	// Each pod adds its timestamp and UID (~200 bytes counted): what is
	// kept is what the last sweep's period added, twice the floor at most.
	if maxBytes > 3*(4<<10) {
		t.Errorf("the table reached %d bytes (%d entries) for pods replaced one at a time", maxBytes, st.Entries)
	}
	if in.Holds(fmt.Sprintf("%012d", 0)) || in.Holds("2026-11-29T10:00:00.") {
		t.Error("a dead pod's values are still in the table after sweeps")
	}
	if in.Holds(strings.Repeat("n", 4<<10)) {
		t.Error("a value longer than MaxLen was interned")
	}
	if !in.Holds(fmt.Sprintf("%012d", 1999)) {
		t.Error("the live pod's UID is not in the table")
	}
}

// Round sweeps only once enough was added: a steady node's table keeps
// its entries, however many rounds pass.
func TestInternerKeepsASteadyTable(t *testing.T) {
	in := new(Interner)
	l := in.Labels(map[string]string{"kubernetes.io/config.source": "api-server-0001"})
	for range 1000 {
		in.Round()
	}
	if st := in.Stats(); st.Sweeps != 0 || st.Entries == 0 {
		t.Errorf("an idle table was swept: %+v", st)
	}
	if again := in.Labels(map[string]string{"kubernetes.io/config.source": "api-server-0001"}); !again.SameAs(l) {
		t.Error("a set of the steady table is no longer shared")
	}
	in.Sweep()
	in.Sweep()
	if st := in.Stats(); st.Entries != 0 || st.Bytes != 0 {
		t.Errorf("two sweeps without a use left %+v", st)
	}
}

// Two Interners share nothing: not a string, not a key set, not a set.
func TestInternersShareNothing(t *testing.T) {
	a, b := new(Interner), new(Interner)
	m := func() map[string]string {
		return map[string]string{strings.Clone("io.kubernetes.container.hash"): strings.Clone("5d1e2c3b"),
			strings.Clone("kubernetes.io/config.source"): strings.Clone("api-server-0001.example")}
	}
	x, y := a.Labels(m()), b.Labels(m())
	if x.keys == y.keys || x.SameAs(y) || unsafe.StringData(x.vals[1]) == unsafe.StringData(y.vals[1]) {
		t.Error("two Interners share what they keep")
	}
}
