package httpapi

import (
	"fmt"
	"net"
	"net/http"
	"strings"
)

// AnyHost in Config.AllowedHosts turns the Host check off.
const AnyHost = "*"

// hostPolicy says which Host headers the full API answers. Loopback
// addresses and localhost always pass: a browser sends them only for
// pages it loaded from the node itself, while a page of another site that
// reaches the API through DNS rebinding (its name re-resolved to
// 127.0.0.1, or to a `kubectl port-forward`) sends that site's name.
type hostPolicy struct {
	any   bool
	hosts map[string]bool // lower-case names and canonical IPs, no port
}

func newHostPolicy(allowed []string) hostPolicy {
	p := hostPolicy{hosts: map[string]bool{}}
	for _, h := range allowed {
		if h == AnyHost {
			p.any = true
			continue
		}
		if n, ok := normalizeHost(h); ok {
			p.hosts[n] = true
		}
	}
	return p
}

// ValidateAllowedHost checks one entry of Config.AllowedHosts: a host name
// or an IP address without a port, or AnyHost.
func ValidateAllowedHost(h string) error {
	if h == AnyHost {
		return nil
	}
	if h == "" {
		return fmt.Errorf("empty host")
	}
	if _, _, err := net.SplitHostPort(h); err == nil {
		return fmt.Errorf("%q has a port: give the host alone (any port is accepted)", h)
	}
	if _, ok := normalizeHost(h); !ok || strings.ContainsAny(h, "/ @?#\\") {
		return fmt.Errorf("%q is not a host name or an IP address", h)
	}
	return nil
}

// normalizeHost returns h without brackets, lower-cased, IPs in canonical
// form.
func normalizeHost(h string) (string, bool) {
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if h == "" {
		return "", false
	}
	if ip := net.ParseIP(h); ip != nil {
		return ip.String(), true
	}
	return strings.ToLower(h), true
}

// allows reports whether a request's Host header (with or without a port)
// passes.
func (p hostPolicy) allows(hostHeader string) bool {
	if p.any || hostHeader == "" { // HTTP/1.0 without Host: not a browser
		return true
	}
	host := hostHeader
	if h, _, err := net.SplitHostPort(hostHeader); err == nil {
		host = h
	}
	n, ok := normalizeHost(host)
	if !ok {
		return false
	}
	if n == "localhost" {
		return true
	}
	if ip := net.ParseIP(n); ip != nil && ip.IsLoopback() {
		return true
	}
	return p.hosts[n]
}

// checkHost answers 421 Misdirected Request to requests whose Host the
// policy refuses.
func (s *Server) checkHost(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.hosts.allows(r.Host) {
			s.metrics.hostRejected.Inc()
			host := r.Host
			if len(host) > 100 {
				host = host[:100] + "..."
			}
			w.Header().Set("Cache-Control", "no-store")
			http.Error(w, fmt.Sprintf("Host %q is not allowed: this API answers only loopback hosts (localhost, 127.0.0.1, [::1]) "+
				"and the allowed ones (pleg run --allowed-hosts), so that a web page cannot read it through DNS rebinding", host),
				http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}
