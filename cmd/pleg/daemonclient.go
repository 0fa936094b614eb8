package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// daemonGet GETs u from a running pleg daemon (pleg check, pleg pods). Its
// error is one line naming the URL and the cause, e.g.
// "cannot reach pleg at http://127.0.0.1:10265/readyz: connection refused".
func daemonGet(ctx context.Context, u, accept string, timeout time.Duration) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("cannot reach pleg at %s: %v", u, err)
	}
	req.Header.Set("Accept", accept)
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		return resp, nil
	}
	cause := err.Error()
	var ue *url.Error
	if errors.As(err, &ue) {
		cause = ue.Err.Error()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		cause = fmt.Sprintf("no answer within %v", timeout)
	} else if i := strings.LastIndex(cause, ": "); i >= 0 && strings.Contains(cause, "dial tcp") {
		cause = cause[i+2:] // "connection refused"
	}
	return nil, fmt.Errorf("cannot reach pleg at %s: %s", u, cause)
}
