package op

import "testing"

func TestMethod(t *testing.T) {
	for o, want := range map[string]string{ContainerStatus: "ContainerStatus",
		ListPodSandbox: "ListPodSandbox", GetContainerEvents: "GetContainerEvents", "other": "other"} {
		if got := Method(o); got != want {
			t.Errorf("Method(%q) = %q, want %q", o, got, want)
		}
	}
}
