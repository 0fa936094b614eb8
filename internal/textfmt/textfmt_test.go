package textfmt

import "testing"

func TestTextForms(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{Plural(0, "pod", "pods"), "pods"},
		{Plural(1, "pod", "pods"), "pod"},
		{Plural(2, "pod hangs", "pods hang"), "pods hang"},
		{ShortID("0123456789abcdef0123"), "0123456789abc"},
		{ShortID("0123456789abc"), "0123456789abc"},
		{ShortID("abc"), "abc"},
		{ShortID(""), ""},
		{PodRef("kube-system", "coredns-1"), "kube-system/coredns-1"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
