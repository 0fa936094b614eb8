// Package textfmt holds the small text forms the commands and reports share:
// plurals, crictl's short IDs, the kubelet's namespace/name pod form, and
// the bounded echo of a client's value in an error.
package textfmt

import (
	"strconv"
	"unicode/utf8"
)

// Plural returns one when n is 1, else many.
func Plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// ShortIDLen is the length of a short ID, as crictl prints them (and
// accepts them as prefixes).
const ShortIDLen = 13

// ShortID cuts a sandbox or container ID to ShortIDLen characters.
func ShortID(id string) string {
	if len(id) > ShortIDLen {
		return id[:ShortIDLen]
	}
	return id
}

// PodRef is a pod's "namespace/name", the form of the kubelet's pod= log
// fields.
func PodRef(namespace, name string) string { return namespace + "/" + name }

// EchoMax is how many bytes of a client's value an error message echoes.
const EchoMax = 128

// Echo quotes a value a client sent, for an error message about it: the
// whole value when it is at most EchoMax bytes, else its first EchoMax
// bytes (cut at a character boundary) and its length. A message never
// carries an unbounded value back (a gRPC status travels in a trailer,
// which clients cap: Node's at 64 KiB).
func Echo(v string) string {
	if len(v) <= EchoMax {
		return strconv.Quote(v)
	}
	cut := EchoMax
	for cut > 0 && !utf8.RuneStart(v[cut]) {
		cut--
	}
	return strconv.Quote(v[:cut]) + "... (" + strconv.Itoa(len(v)) + " bytes)"
}

// ReasonMax bounds a reason that another library wrote about a client's
// value (it may quote the value).
const ReasonMax = 256

// Bound cuts s to at most n bytes (at a character boundary), saying so.
func Bound(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "... (" + strconv.Itoa(len(s)) + " bytes)"
}
