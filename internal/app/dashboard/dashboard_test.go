package dashboard

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func get(t *testing.T, h http.Handler, method, path string) (*http.Response, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	resp := rec.Result()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestHandlerServesThePage(t *testing.T) {
	h := Handler()
	for _, c := range []struct {
		path, ctype, contains string
	}{
		{"/", "text/html", `<script type="module" src="app.js"></script>`},
		{"/app.js", "javascript", "new EventSource('api/v1/events')"},
		{"/style.css", "text/css", ".banner"},
		{"/favicon.svg", "image/svg+xml", "<svg"},
	} {
		resp, body := get(t, h, http.MethodGet, c.path)
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), c.ctype) || !strings.Contains(body, c.contains) {
			t.Errorf("GET %s: %d %q, body has %q: %v", c.path, resp.StatusCode, resp.Header.Get("Content-Type"),
				c.contains, strings.Contains(body, c.contains))
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
			t.Errorf("GET %s: CSP %q", c.path, csp)
		}
	}
	for _, p := range []string{"/nope", "/static/app.js", "/api/v1/unknown", "/../dashboard.go"} {
		if resp, _ := get(t, h, http.MethodGet, p); resp.StatusCode != 404 {
			t.Errorf("GET %s: %d, want 404", p, resp.StatusCode)
		}
	}
	if resp, _ := get(t, h, http.MethodPost, "/"); resp.StatusCode != 405 {
		t.Errorf("POST /: %d, want 405", resp.StatusCode)
	}
	if resp, body := get(t, h, http.MethodHead, "/"); resp.StatusCode != 200 || body != "" {
		t.Errorf("HEAD /: %d %q", resp.StatusCode, body)
	}
}

// TestNoExternalResources: everything the page loads is its own.
func TestNoExternalResources(t *testing.T) {
	h := Handler()
	ref := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}`)
	for _, p := range []string{"/", "/app.js", "/style.css"} {
		_, body := get(t, h, http.MethodGet, p)
		for _, m := range ref.FindAllString(body, -1) {
			if m != "http://www.w3.org" { // the SVG namespace, not a fetch
				t.Errorf("%s refers to %s", p, m)
			}
		}
	}
	_, body := get(t, h, http.MethodGet, "/app.js")
	for _, bad := range []string{"innerHTML", "eval(", "document.write"} {
		if strings.Contains(body, bad) {
			t.Errorf("app.js uses %s", bad)
		}
	}
	// Relative URLs only, so the page works behind a path prefix.
	if strings.Contains(body, "'/api/") || strings.Contains(body, "'/readyz") {
		t.Error("app.js uses an absolute API path")
	}
}
