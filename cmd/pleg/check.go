package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/cruntime/cri"
	"github.com/podlifecycle/pleg/internal/textfmt"
)

func init() { register(newCheckCmd) }

// Exit codes of the node-problem-detector custom plugin protocol.
const (
	checkOK      = 0
	checkProblem = 1
	checkUnknown = 2
)

type checkOptions struct {
	url      string
	runtime  bool
	forecast bool
	timeout  time.Duration
}

// defaultDaemonURL is where `pleg run` serves with its default
// --listen-address.
func defaultDaemonURL(path string) string { return "http://" + defaultListenAddress + path }

func newCheckCmd() *cobra.Command {
	rf := &runtimeFlags{}
	o := &checkOptions{}
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Check PLEG health once, as a node-problem-detector custom plugin",
		Long: `check prints one line on stdout, the condition message, and exits with the
node-problem-detector custom plugin protocol's code: 0 healthy, 1 problem,
2 unknown.

By default it asks a running ` + "`pleg run`" + ` for its node Ready condition (GET
--url, the daemon's /readyz) and prints the condition's message, e.g.

  kubelet is posting ready status                                       (0)
  PLEG is not healthy: pleg was last seen active 3m12.45s ago; threshold is 3m0s   (1)
  cannot reach pleg at http://127.0.0.1:10265/readyz: connection refused  (2)

A daemon that cannot be reached, or answers something else than a Ready
condition, is "unknown" (2). --url may also name /healthz (200 "ok" is
healthy, 500 is a problem).

With --forecast it prints the daemon's forecast of the kubelet's PLEG
instead (docs/forecast.md): 1 when the kubelet's PLEG will report "PLEG is
not healthy", e.g.

  the kubelet's PLEG will report not healthy in ~2m40s: ContainerStatus for pod default/db-0 hangs (2m0s request timeout, once per relist), and 1 more pod hangs: default/db-1; relist ~4m0s, threshold 3m0s   (1)
  the kubelet's PLEG is not at risk: its relist would take ~35ms (threshold 3m0s)   (0)

and 2 when it cannot tell (the daemon cannot be reached, or gives no
forecast). Its /readyz status code (pleg's own health) does not matter then.

With --runtime it checks the container runtime directly instead: CRI
Version, Status (RuntimeReady and NetworkReady) and one listing of every pod
and container, all within --timeout; a runtime that cannot be reached, is not
ready or does not list in time is a problem (1).

See deploy/npd/pleg-plugin-monitor.json for a node-problem-detector
configuration.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runCheck(cmd, rf, o) },
	}
	f := cmd.Flags()
	f.StringVar(&o.url, "url", defaultDaemonURL("/readyz"),
		"the daemon's /readyz (or /healthz) URL; a URL without a path gets /readyz")
	f.BoolVar(&o.runtime, "runtime", false, "check the container runtime at --container-runtime-endpoint instead of the daemon")
	f.BoolVar(&o.forecast, "forecast", false, "check the daemon's forecast of the kubelet's PLEG (is it about to report not healthy?) instead of pleg's own condition")
	durationVar(f, &o.timeout, "timeout", 10*time.Second, minClientTimeout, time.Hour, "give up after this long (unknown for the daemon, a problem for the runtime)")
	rf.addFlags(f)
	// Only the endpoint matters, and only with --runtime.
	for _, name := range []string{"runtime-request-timeout", "relist-period", "relist-threshold",
		"max-parallel-inspections", "pod-inspection-timeout", "events"} {
		_ = f.MarkHidden(name)
	}
	return cmd
}

func runCheck(cmd *cobra.Command, rf *runtimeFlags, o *checkOptions) error {
	ctx, stop := signalContext(cmd)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	var code int
	var msg string
	if o.runtime && o.forecast {
		return usageErrorf("--forecast and --runtime exclude each other: the forecast comes from the daemon")
	}
	if o.runtime {
		if err := rf.validate(); err != nil {
			return err
		}
		code, msg = checkRuntime(ctx, rf.endpoint, o.timeout)
	} else {
		u, err := checkURL(o.url, "/readyz")
		if err != nil {
			return err
		}
		code, msg = checkDaemon(ctx, u, o.timeout, o.forecast)
	}
	if _, err := fmt.Fprintln(cmd.OutOrStdout(), oneLine(msg)); err != nil {
		return exitCodeError{code: checkUnknown, err: err}
	}
	switch code {
	case checkOK:
		return nil
	case checkProblem:
		return exitCodeError{code: checkProblem} // the line above says why
	default:
		return exitCodeError{code: checkUnknown}
	}
}

// checkURL validates a daemon URL flag; one without a path gets path.
func checkURL(raw, path string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", usageErrorf("invalid --url %q: want http://host:port%s", raw, path)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = path
	}
	return u.String(), nil
}

// checkDaemon asks the daemon at u for its condition, or its forecast.
func checkDaemon(ctx context.Context, u string, timeout time.Duration, forecast bool) (int, string) {
	resp, err := daemonGet(ctx, u, "application/json, text/plain", timeout)
	if err != nil {
		return checkUnknown, err.Error()
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return checkUnknown, fmt.Sprintf("reading the answer of pleg at %s: %v", u, err)
	}
	bad := func(why string) (int, string) {
		return checkUnknown, fmt.Sprintf("unexpected answer from pleg at %s: HTTP %d, %s", u, resp.StatusCode, why)
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if forecast {
		if mt != "application/json" {
			return bad(fmt.Sprintf("content type %q: --forecast needs the daemon's /readyz", resp.Header.Get("Content-Type")))
		}
		var r struct {
			Forecast *struct {
				AtRisk  bool   `json:"atRisk"`
				Message string `json:"message"`
			} `json:"forecast"`
		}
		switch err := json.Unmarshal(body, &r); {
		case err != nil:
			return bad("not a Ready condition: " + err.Error())
		case r.Forecast == nil || r.Forecast.Message == "":
			return bad("no forecast (a pleg older than the forecast, or not /readyz)")
		case r.Forecast.AtRisk:
			return checkProblem, r.Forecast.Message
		}
		return checkOK, r.Forecast.Message
	}
	switch mt {
	case "application/json":
		// The node Ready condition (pleg.Condition) of /readyz.
		var c struct {
			Type    string `json:"type"`
			Status  string `json:"status"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(body, &c); err != nil {
			return bad("not a Ready condition: " + err.Error())
		}
		switch {
		case c.Message == "":
			return bad("a condition without a message")
		case c.Status == "True":
			return checkOK, c.Message
		case c.Status == "False":
			return checkProblem, c.Message
		}
		return bad(fmt.Sprintf("condition status %q", c.Status))
	case "text/plain":
		// /healthz: 200 "ok", 500 "PLEG is not healthy: ...".
		text := strings.TrimSpace(string(body))
		switch {
		case text == "":
			return bad("an empty body")
		case resp.StatusCode == http.StatusOK:
			return checkOK, text
		case resp.StatusCode == http.StatusInternalServerError || resp.StatusCode == http.StatusServiceUnavailable:
			return checkProblem, text
		}
		return bad(fmt.Sprintf("%q", firstLine(text)))
	}
	return bad(fmt.Sprintf("content type %q", resp.Header.Get("Content-Type")))
}

// checkRuntime checks the runtime at endpoint directly.
func checkRuntime(ctx context.Context, endpoint string, timeout time.Duration) (int, string) {
	client, err := cri.Dial(endpoint, cri.WithTimeout(timeout), cri.WithLogger(logr.Discard()))
	if err != nil {
		return checkUnknown, err.Error() // validated already
	}
	defer client.Close()
	name, version, err := client.Version(ctx)
	if err != nil {
		return checkProblem, "container runtime is down: " + reachError(endpoint, timeout, err).Error()
	}
	conds, err := client.Status(ctx)
	if err != nil {
		return checkProblem, "container runtime status check failed: " + callCause(err, timeout)
	}
	if errs := pleg.RuntimeConditionErrors(conds); len(errs) > 0 {
		return checkProblem, pleg.JoinErrors(errs)
	}
	start := time.Now()
	pods, err := client.ListPods(ctx)
	if err != nil {
		return checkProblem, "listing pods failed: " + callCause(err, timeout)
	}
	return checkOK, fmt.Sprintf("container runtime %s %s is ready; listed %d %s in %v",
		name, version, len(pods), textfmt.Plural(len(pods), "pod", "pods"), time.Since(start).Round(time.Millisecond))
}

// callCause describes a failed runtime call, a timeout as such.
func callCause(err error, timeout time.Duration) string {
	if errors.Is(err, context.DeadlineExceeded) {
		var ce *cri.CallError
		if errors.As(err, &ce) {
			return fmt.Sprintf("%s did not answer within %v", ce.Method, timeout)
		}
		return fmt.Sprintf("no answer within %v", timeout)
	}
	return err.Error()
}

// oneLine makes msg one line, as the plugin protocol wants.
func oneLine(msg string) string {
	return strings.Join(strings.Fields(msg), " ")
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	return s
}
