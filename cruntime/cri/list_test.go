package cri

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
)

func sandbox(id, uid, name, ns string, attempt uint32, st runtimeapi.PodSandboxState, created int64) *runtimeapi.PodSandbox {
	return &runtimeapi.PodSandbox{
		Id:        id,
		Metadata:  &runtimeapi.PodSandboxMetadata{Name: name, Uid: uid, Namespace: ns, Attempt: attempt},
		State:     st,
		CreatedAt: created,
		Labels:    label(uid, name, ns, ""),
	}
}

func container(id, name string, attempt uint32, st runtimeapi.ContainerState, image string, created int64, labels map[string]string) *runtimeapi.Container {
	c := &runtimeapi.Container{
		Id:        id,
		Metadata:  &runtimeapi.ContainerMetadata{Name: name, Attempt: attempt},
		State:     st,
		CreatedAt: created,
		Labels:    labels,
	}
	if image != "" {
		c.Image = &runtimeapi.ImageSpec{Image: image}
	}
	return c
}

// staticLister answers list calls with fixed items, applying the label
// selector like a runtime does.
func staticLister(f *fakeCRI, sandboxes []*runtimeapi.PodSandbox, containers []*runtimeapi.Container) {
	matches := func(sel, labels map[string]string) bool {
		for k, v := range sel {
			if labels[k] != v {
				return false
			}
		}
		return true
	}
	f.listSandboxes = func(_ context.Context, r *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
		var out []*runtimeapi.PodSandbox
		for _, s := range sandboxes {
			if matches(r.GetFilter().GetLabelSelector(), s.Labels) {
				out = append(out, s)
			}
		}
		return &runtimeapi.ListPodSandboxResponse{Items: out}, nil
	}
	f.listContainers = func(_ context.Context, r *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
		var out []*runtimeapi.Container
		for _, c := range containers {
			if matches(r.GetFilter().GetLabelSelector(), c.Labels) {
				out = append(out, c)
			}
		}
		return &runtimeapi.ListContainersResponse{Containers: out}, nil
	}
}

func TestListPodsGroupsByUID(t *testing.T) {
	f := &fakeCRI{}
	staticLister(f,
		[]*runtimeapi.PodSandbox{
			sandbox("sb-b", "uid-b", "pod-b", "ns-b", 0, 99, 300),
			sandbox("sb-a2", "uid-a", "pod-a", "default", 1, runtimeapi.PodSandboxState_SANDBOX_READY, 200),
			sandbox("sb-a1", "uid-a", "pod-a", "default", 0, runtimeapi.PodSandboxState_SANDBOX_NOTREADY, 100),
		},
		[]*runtimeapi.Container{
			container("c-run", "app", 2, runtimeapi.ContainerState_CONTAINER_RUNNING, "nginx:1", 210, label("uid-a", "pod-a", "default", "app")),
			container("c-created", "init", 0, runtimeapi.ContainerState_CONTAINER_CREATED, "busybox", 220, label("uid-a", "pod-a", "default", "init")),
			// No metadata name: the label names it.
			container("c-exited", "", 0, runtimeapi.ContainerState_CONTAINER_EXITED, "side:1", 230, label("uid-a", "pod-a", "default", "side")),
			container("c-unknown", "u", 0, runtimeapi.ContainerState_CONTAINER_UNKNOWN, "", 240, label("uid-b", "", "", "")),
			container("c-99", "weird", 0, 99, "", 250, label("uid-b", "", "", "")),
			// A container whose pod has no sandbox.
			container("c-orphan", "lonely", 0, runtimeapi.ContainerState_CONTAINER_RUNNING, "x", 260, label("uid-c", "pod-c", "kube-system", "lonely")),
		})
	c := f.start(t)

	pods, err := c.ListPods(context.Background())

	if err != nil {
		t.Fatal(err)
	}
	want := []*cruntime.Pod{
		{
			UID: "uid-a", Name: "pod-a", Namespace: "default",
			Sandboxes: []*cruntime.Container{
				{ID: "sb-a2", Name: "pod-a", Attempt: 1, State: cruntime.StateRunning, CreatedAt: 200},
				{ID: "sb-a1", Name: "pod-a", Attempt: 0, State: cruntime.StateExited, CreatedAt: 100},
			},
			Containers: []*cruntime.Container{
				{ID: "c-run", Name: "app", Attempt: 2, State: cruntime.StateRunning, Image: "nginx:1", CreatedAt: 210},
				{ID: "c-created", Name: "init", State: cruntime.StateCreated, Image: "busybox", CreatedAt: 220},
				{ID: "c-exited", Name: "side", State: cruntime.StateExited, Image: "side:1", CreatedAt: 230},
			},
		},
		{
			UID: "uid-b", Name: "pod-b", Namespace: "ns-b",
			Sandboxes: []*cruntime.Container{
				{ID: "sb-b", Name: "pod-b", State: cruntime.StateUnknown, CreatedAt: 300},
			},
			Containers: []*cruntime.Container{
				{ID: "c-unknown", Name: "u", State: cruntime.StateUnknown, CreatedAt: 240},
				{ID: "c-99", Name: "weird", State: cruntime.StateUnknown, CreatedAt: 250},
			},
		},
		{
			UID: "uid-c", Name: "pod-c", Namespace: "kube-system",
			Containers: []*cruntime.Container{
				{ID: "c-orphan", Name: "lonely", State: cruntime.StateRunning, Image: "x", CreatedAt: 260},
			},
		},
	}
	if !reflect.DeepEqual(pods, want) {
		t.Errorf("ListPods:\n got %s\nwant %s", dump(pods), dump(want))
	}

	sl, cl, _, _ := f.recorded()
	if len(sl) != 1 || len(cl) != 1 {
		t.Fatalf("list calls: %d ListPodSandbox, %d ListContainers; want 1 each", len(sl), len(cl))
	}
	if len(sl[0].GetFilter().GetLabelSelector()) != 0 || sl[0].GetFilter().GetState() != nil ||
		len(cl[0].GetFilter().GetLabelSelector()) != 0 || cl[0].GetFilter().GetState() != nil {
		t.Errorf("ListPods sent filters: %v / %v; want none", sl[0].GetFilter(), cl[0].GetFilter())
	}
}

func dump(pods []*cruntime.Pod) string {
	s := ""
	for _, p := range pods {
		s += "\n  " + sprint(*p)
		for _, c := range p.Sandboxes {
			s += "\n    sandbox " + sprint(*c)
		}
		for _, c := range p.Containers {
			s += "\n    container " + sprint(*c)
		}
	}
	return s
}

func TestListPodsSkipsMalformed(t *testing.T) {
	f := &fakeCRI{}
	good := container("c-ok", "ok", 0, runtimeapi.ContainerState_CONTAINER_RUNNING, "", 1, label("uid-a", "", "", ""))
	staticLister(f,
		[]*runtimeapi.PodSandbox{
			{Id: "sb-nometa", State: runtimeapi.PodSandboxState_SANDBOX_READY},
			{Id: "", Metadata: &runtimeapi.PodSandboxMetadata{Uid: "uid-x", Name: "x"}},
			{Id: "sb-nouid", Metadata: &runtimeapi.PodSandboxMetadata{Name: "nouid"}},
		},
		[]*runtimeapi.Container{
			{Id: "c-nometa", Labels: label("uid-a", "", "", "")},
			{Id: "", Metadata: &runtimeapi.ContainerMetadata{Name: "noid"}, Labels: label("uid-a", "", "", "")},
			{Id: "c-nolabels", Metadata: &runtimeapi.ContainerMetadata{Name: "nolabels"}},
			{Id: "c-nouid", Metadata: &runtimeapi.ContainerMetadata{Name: "nouid"}, Labels: label("", "pod", "ns", "nouid")},
			good, // nil Image
		})
	c := f.start(t, WithLogger(logr.Discard()))

	pods, err := c.ListPods(context.Background())

	if err != nil {
		t.Fatal(err)
	}
	want := []*cruntime.Pod{{
		UID:        "uid-a",
		Containers: []*cruntime.Container{{ID: "c-ok", Name: "ok", State: cruntime.StateRunning, CreatedAt: 1}},
	}}
	if !reflect.DeepEqual(pods, want) {
		t.Errorf("ListPods:\n got %s\nwant %s", dump(pods), dump(want))
	}
}

func TestListPodsEmptyResponses(t *testing.T) {
	f := &fakeCRI{
		listSandboxes: func(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
			return &runtimeapi.ListPodSandboxResponse{}, nil
		},
		listContainers: func(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
			return &runtimeapi.ListContainersResponse{}, nil
		},
	}
	c := f.start(t)
	pods, err := c.ListPods(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 0 {
		t.Errorf("ListPods = %v, want none", pods)
	}
}

// TestGroupNilItems feeds group what no wire message can carry: nil items
// (as the filtered path converts them).
func TestGroupNilItems(t *testing.T) {
	c := &Client{log: logr.Discard()}
	pods := c.group(
		refs(sandboxItem(nil), sandboxItem(sandbox("sb", "uid", "p", "n", 0, 0, 1))),
		refs(containerItem(nil), containerItem(&runtimeapi.Container{Id: "c", Metadata: &runtimeapi.ContainerMetadata{}, Labels: label("uid", "", "", "")})),
		&groupScratch{}, nil,
	)
	if len(pods) != 1 || len(pods[0].Sandboxes) != 1 || len(pods[0].Containers) != 1 {
		t.Errorf("group = %s", dump(pods))
	}
	if pods := c.group(nil, nil, &groupScratch{}, nil); len(pods) != 0 {
		t.Errorf("group(nil, nil) = %v", pods)
	}
}

func TestListPodSendsFilters(t *testing.T) {
	f := &fakeCRI{}
	staticLister(f,
		[]*runtimeapi.PodSandbox{
			sandbox("sb-a", "uid-a", "pod-a", "default", 0, runtimeapi.PodSandboxState_SANDBOX_READY, 1),
			sandbox("sb-b", "uid-b", "pod-b", "default", 0, runtimeapi.PodSandboxState_SANDBOX_READY, 2),
		},
		[]*runtimeapi.Container{
			container("c-a", "app", 0, runtimeapi.ContainerState_CONTAINER_RUNNING, "img", 3, label("uid-a", "pod-a", "default", "app")),
			container("c-b", "app", 0, runtimeapi.ContainerState_CONTAINER_RUNNING, "img", 4, label("uid-b", "pod-b", "default", "app")),
		})
	c := f.start(t)

	p, err := c.ListPod(context.Background(), "uid-a")

	if err != nil {
		t.Fatal(err)
	}
	if p == nil || p.UID != "uid-a" || p.Name != "pod-a" || len(p.Sandboxes) != 1 || p.Sandboxes[0].ID != "sb-a" ||
		len(p.Containers) != 1 || p.Containers[0].ID != "c-a" {
		t.Errorf("ListPod(uid-a) = %s", dump([]*cruntime.Pod{p}))
	}
	sl, cl, _, _ := f.recorded()
	wantSel := map[string]string{"io.kubernetes.pod.uid": "uid-a"}
	if len(sl) != 1 || !reflect.DeepEqual(sl[0].GetFilter().GetLabelSelector(), wantSel) {
		t.Errorf("ListPodSandbox requests = %v, want one with label selector %v", sl, wantSel)
	}
	if len(cl) != 1 || !reflect.DeepEqual(cl[0].GetFilter().GetLabelSelector(), wantSel) {
		t.Errorf("ListContainers requests = %v, want one with label selector %v", cl, wantSel)
	}
	if sl[0].GetFilter().GetState() != nil || sl[0].GetFilter().GetId() != "" ||
		cl[0].GetFilter().GetState() != nil || cl[0].GetFilter().GetId() != "" || cl[0].GetFilter().GetPodSandboxId() != "" {
		t.Errorf("ListPod sent more than the label selector: %v / %v", sl[0].GetFilter(), cl[0].GetFilter())
	}

	p, err = c.ListPod(context.Background(), "uid-missing")
	if p != nil || err != nil {
		t.Errorf("ListPod(uid-missing) = %v, %v; want nil, nil", p, err)
	}
	if _, err := c.ListPod(context.Background(), ""); err == nil {
		t.Error("ListPod(\"\") succeeded; want an error")
	}
}

// TestListPodIgnoresOtherPods checks that ListPod keeps only its pod when
// the runtime ignores the filter.
func TestListPodIgnoresOtherPods(t *testing.T) {
	f := &fakeCRI{
		listSandboxes: func(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
			return &runtimeapi.ListPodSandboxResponse{Items: []*runtimeapi.PodSandbox{
				sandbox("sb-b", "uid-b", "pod-b", "default", 0, runtimeapi.PodSandboxState_SANDBOX_READY, 2),
			}}, nil
		},
		listContainers: func(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
			return &runtimeapi.ListContainersResponse{}, nil
		},
	}
	c := f.start(t)
	p, err := c.ListPod(context.Background(), "uid-a")
	if p != nil || err != nil {
		t.Errorf("ListPod(uid-a) = %v, %v; want nil, nil", p, err)
	}
}

func TestListErrors(t *testing.T) {
	f := &fakeCRI{
		listSandboxes: func(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
			return &runtimeapi.ListPodSandboxResponse{}, nil
		},
		// ListContainers: Unimplemented.
	}
	c := f.start(t)
	_, err := c.ListPods(context.Background())
	if err == nil || !contains(err.Error(), "ListContainers: rpc error: code = Unimplemented") {
		t.Errorf("ListPods error = %v; want a ListContainers Unimplemented error", err)
	}
	_, err = c.ListPod(context.Background(), types.UID("u"))
	if err == nil {
		t.Error("ListPod succeeded; want an error")
	}
}

func TestListPodsConcurrent(t *testing.T) {
	f := &fakeCRI{}
	staticLister(f,
		[]*runtimeapi.PodSandbox{sandbox("sb-a", "uid-a", "pod-a", "default", 0, runtimeapi.PodSandboxState_SANDBOX_READY, 1)},
		[]*runtimeapi.Container{container("c-a", "app", 0, runtimeapi.ContainerState_CONTAINER_RUNNING, "img", 3, label("uid-a", "pod-a", "default", "app"))})
	c := f.start(t)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 5 {
				if pods, err := c.ListPods(context.Background()); err != nil || len(pods) != 1 {
					t.Errorf("ListPods = %v, %v", pods, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// refs makes freshly decoded items of items.
func refs(items ...listed) []itemRef {
	out := make([]itemRef, len(items))
	for i := range items {
		out[i] = itemRef{listed: &items[i]}
	}
	return out
}

// The items a listing skips are logged in one line per reply, however
// many, with their count by reason.
func TestListPodsLogsSkippedOnce(t *testing.T) {
	f := &fakeCRI{}
	var sbs []*runtimeapi.PodSandbox
	for i := range 50 {
		sbs = append(sbs, &runtimeapi.PodSandbox{Id: fmt.Sprint("sb-nometa-", i)})
	}
	sbs = append(sbs, &runtimeapi.PodSandbox{Metadata: &runtimeapi.PodSandboxMetadata{Uid: "u"}})
	staticLister(f, sbs, []*runtimeapi.Container{{Id: "c", Metadata: &runtimeapi.ContainerMetadata{}}})
	var lines []string
	log := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{Verbosity: 4})
	c := f.start(t, WithLogger(log))
	if _, err := c.ListPods(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`"msg"="Skipping listed items that cannot be grouped" "kind"="sandbox" "emptyID"=1 "noMetadata"=50 "noPodUID"=0 "firstID"="sb-nometa-0" "firstReason"="no metadata"`,
		`"msg"="Skipping listed items that cannot be grouped" "kind"="container" "emptyID"=0 "noMetadata"=0 "noPodUID"=1 "firstID"="c" "firstReason"="no pod UID"`,
	}
	var got []string
	for _, l := range lines {
		if strings.Contains(l, "Skipping") {
			got = append(got, l[strings.Index(l, `"msg"`):])
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("logged\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
