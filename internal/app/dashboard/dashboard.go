// Package dashboard is the live web page `pleg run` serves on "/": a
// health banner with the exact Ready condition and /healthz messages, the
// recent relist durations against the health threshold, the lifecycle
// event feed, the pod status cache with every container's state, and the
// slow pods (those whose inspection timed out).
//
// The page is static HTML, CSS and vanilla JavaScript embedded in the
// binary, with no external resource: it reads the daemon's own endpoints
// (readyz, healthz, api/v1/relists, api/v1/pods, the api/v1/events
// Server-Sent Events stream and metrics) through relative URLs, so it also
// works behind a path prefix such as a kubectl proxy.
package dashboard

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
)

//go:embed static
var static embed.FS

// files holds the page's files at its root.
var files = func() fs.FS {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err)
	}
	return sub
}()

// contentSecurityPolicy allows nothing but this origin: no CDN, no inline
// script.
const contentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'"

// Handler serves the dashboard: index.html on "/" (and on "/index.html"),
// its assets beside it, 404 for anything else. Mount it on "/" next to the
// API, e.g. httpapi.Server.Handle("/", dashboard.Handler()).
func Handler() http.Handler {
	fileServer := http.FileServerFS(files)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		name := path.Base(r.URL.Path)
		if r.URL.Path == "/" || r.URL.Path == "/index.html" {
			name = "index.html"
		} else if path.Dir(r.URL.Path) != "/" {
			http.NotFound(w, r)
			return
		}
		if _, err := fs.Stat(files, name); err != nil {
			http.NotFound(w, r)
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		if name == "index.html" {
			// FileServer redirects /index.html to ./; serve the file itself.
			http.ServeFileFS(w, r, files, "index.html")
			return
		}
		fileServer.ServeHTTP(w, r)
	})
}
