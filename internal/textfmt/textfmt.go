// Package textfmt holds the small text forms the commands and reports share:
// plurals, crictl's short IDs and the kubelet's namespace/name pod form.
package textfmt

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
