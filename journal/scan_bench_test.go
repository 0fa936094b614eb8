package journal

import (
	"context"
	"fmt"
	"testing"

	"github.com/podlifecycle/pleg/cruntime"

	"k8s.io/apimachinery/pkg/types"
)

// BenchmarkNextFilteredBehind: a filtered watcher resumes from the oldest
// retained entry and skips DefaultSize entries of other pods to reach the
// one it selects (one op: one such Next).
func BenchmarkNextFilteredBehind(b *testing.B) {
	j := New(Options{Epoch: "e"})
	other := &Pod{UID: "o", Namespace: "shop", Labels: cruntime.LabelsOf("app", "web", "tier", "front")}
	for range DefaultSize - 1 {
		j.Append(Entry{Kind: KindPod, Pod: other, Transitions: []Transition{{Type: "PodSync"}}})
	}
	mine := &Pod{UID: types.UID("m"), Namespace: "shop", Labels: cruntime.LabelsOf("app", "db")}
	j.Append(Entry{Kind: KindPod, Pod: mine, Transitions: []Transition{{Type: "PodSync"}}})
	f, err := NewFilter(FilterSpec{Namespaces: []string{"shop"}, LabelSelector: "app=db"})
	if err != nil {
		b.Fatal(err)
	}
	cursor := fmt.Sprintf("e-%d", j.Head().Seq-DefaultSize)
	b.ResetTimer()
	for range b.N {
		w, err := j.Watch(cursor, f)
		if err != nil {
			b.Fatal(err)
		}
		if m, err := w.Next(context.Background()); err != nil || m.Pod != mine {
			b.Fatalf("%v %v", m, err)
		}
		w.Close()
	}
}
